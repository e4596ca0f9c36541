"""Writing to a plain TCP transport at once when nothing is queued on it.

Twisted's public ``write`` always queues: the bytes wait for the reactor's next turn, after
an ``epoll_ctl`` registering the socket for writing and another removing it.  When the
transport's queue is empty, ``sendNow`` calls ``send`` on its socket directly and hands
only what the kernel did not take to ``write``, so the order of bytes is kept and flow
control is unchanged.  Any other transport (TLS, test transports) gets a plain ``write``.

This is the one module that reads Twisted internals (the buffer attributes of
``twisted.internet.abstract.FileDescriptor``): ``tests/http/test_fastwrite.py`` pins exactly the
behaviour relied on, and should a Twisted release rename them, every write takes the public
path.  It is kept because it is measured to be worth it: ``python -m bench.serverwrite``
compares server CPU per request over loopback with ``DIRECT`` on and off.
"""

from __future__ import annotations

from typing import TypeGuard

from twisted.internet import tcp
from twisted.internet.interfaces import ITransport

_PLAIN = (tcp.Server, tcp.Client)
DIRECT = True  # False: every write takes the public path (the benchmark's B side)


def _idle(transport: object) -> TypeGuard[tcp.Connection]:
    """Whether ``transport`` is a plain TCP transport (``_PLAIN``), connected, with nothing
    queued (``False`` when its buffer attributes are not the ones this module knows)."""
    # ``_PLAIN``'s types are connections: ``isinstance`` is for the type checker (what
    # follows reads attributes no interface declares).
    if type(transport) not in _PLAIN or not isinstance(transport, tcp.Connection):
        return False
    try:
        return bool(
            not transport.TLS
            and transport.connected
            and not transport.disconnecting
            and not transport._writeDisconnected
            and not transport._tempDataBuffer
            and len(transport.dataBuffer) == transport.offset
        )
    except AttributeError:
        return False


def sendNow(transport: ITransport, data: bytes) -> None:
    """Write ``data`` to ``transport``, sending it at once when that keeps the byte order."""
    if DIRECT and data and _idle(transport):
        try:
            sent = transport.socket.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            sent = 0  # the queued write below meets the error and closes the connection
        if sent >= len(data):
            return
        data = data[sent:]
    transport.write(data)
