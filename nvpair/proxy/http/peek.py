"""The pool's look at an idle connection before reusing it: whether its engine already
closed it, the close waiting in the socket not read yet (llama-server closes after a
streamed answer though it says keep-alive; a request sent on such a connection is lost).

The socket's ``recv`` is looked up once per connection (``socketRecv``, when it is made);
each reuse then costs one peek (``peerClosed``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from OpenSSL import SSL
from twisted.internet.interfaces import ISystemHandle

__all__ = ["peerClosed", "socketRecv"]

_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


def socketRecv(transport: object) -> Callable[[int, int], bytes] | None:
    """The ``recv`` of the socket under ``transport`` (``ISystemHandle``), which
    ``peerClosed`` peeks with; None for a transport with no socket to ask (TLS, test
    transports).  Looked up once per connection, when it is made."""
    handle = ISystemHandle(transport, None)
    sock = None if handle is None else handle.getHandle()
    if isinstance(sock, SSL.Connection):
        return None
    recv: Callable[[int, int], bytes] | None = getattr(sock, "recv", None)
    return recv


def peerClosed(recv: Callable[[int, int], bytes] | None) -> bool:
    """Whether the peer of a connection closed or reset it, its end not read yet: one
    byte peeked with its socket's ``recv`` (``socketRecv``) without taking it.  False when
    nothing waits, bytes wait (the connection's reader deals with those), or there is no
    socket to ask."""
    if recv is None:
        return False
    try:
        waiting = recv(1, _PEEK)
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset
    return waiting == b""
