"""The pool's look at an idle connection before reusing it: whether its engine already
closed it, the close waiting in the socket not read yet (llama-server closes after a
streamed answer though it says keep-alive; a request sent on such a connection is lost).

Each connection gets its ``SocketPeek`` once, when it is made (``socketPeek``): a
``poll`` set holding its socket alone.  Each reuse then costs one ``poll(0)``, which finds
nothing in the usual case; only a socket with something to read is peeked with ``recv``
(``MSG_PEEK``), which tells a close (nothing but the end) or a reset from bytes waiting.
Peeking every reuse with a non-blocking ``recv`` raised ``BlockingIOError`` each time:
about four times the instructions of the ``poll`` (bench/RESULTS.md).
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable
from typing import Protocol

from OpenSSL import SSL
from twisted.internet.interfaces import ISystemHandle

__all__ = ["POLL", "SocketPeek", "socketPeek"]

_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


class Poll(Protocol):
    """What ``socketPeek`` needs of a ``select.poll`` object."""

    def register(self, fd: int, eventmask: int = ..., /) -> None: ...
    def poll(self, timeout: float | None = ..., /) -> list[tuple[int, int]]: ...


POLL: Callable[[], Poll] = select.poll
"""Makes each connection's poll set (the tests give a fake)."""


class SocketPeek:
    """Whether the peer of one connection closed or reset it, its end not read yet."""

    __slots__ = ("_poll", "_recv")

    def __init__(
        self, poll: Callable[[float], list[tuple[int, int]]], recv: Callable[[int, int], bytes]
    ) -> None:
        self._poll = poll
        self._recv = recv

    def closed(self) -> bool:
        """True when the socket holds the peer's close or a reset; False when nothing
        waits or bytes wait (the connection's reader deals with those)."""
        if not self._poll(0):
            return False
        try:
            waiting = self._recv(1, _PEEK)
        except BlockingIOError:
            return False
        except OSError:
            return True  # reset
        return waiting == b""


def socketPeek(transport: object) -> SocketPeek | None:
    """The ``SocketPeek`` of the socket under ``transport`` (``ISystemHandle``); None for
    a transport with no socket to ask (TLS, test transports), taken as open."""
    handle = ISystemHandle(transport, None)
    sock = None if handle is None else handle.getHandle()
    if sock is None or isinstance(sock, SSL.Connection):
        return None
    fileno, recv = getattr(sock, "fileno", None), getattr(sock, "recv", None)
    if fileno is None or recv is None:
        return None
    poll = POLL()
    poll.register(fileno(), select.POLLIN)
    return SocketPeek(poll.poll, recv)
