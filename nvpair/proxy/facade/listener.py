"""The listener personalities (spec §7, protocol §8): one port, told apart by the first byte.

``0x16`` opens a TLS handshake and goes to the cluster personality when this node is a
member; anything else is plaintext HTTP, served only to loopback peers.  Everything else
is closed without an HTTP answer.  The factory also bounds how many connections it holds
and drops connections that never send a first byte.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    ITCPTransport,
)
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.logger import Logger
from twisted.python.failure import Failure

TLS_HANDSHAKE = 0x16
_CLOSED = Failure(ConnectionDone())


def isLoopback(address: IAddress) -> bool:
    """Whether a peer address is loopback (127.0.0.0/8, ::1, or v4-mapped loopback)."""
    host = getattr(address, "host", None)
    if not isinstance(host, str):
        return False
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


class PersonalitySwitch(Protocol):
    """Stays the TCP protocol and hands the connection to the personality its first byte picks."""

    transport: ITCPTransport | None

    def __init__(self, factory: PersonalityFactory, addr: IAddress) -> None:
        self._factory = factory
        self._addr = addr
        self._inner: IProtocol | None = None
        self._idle: IDelayedCall | None = None

    def connectionMade(self) -> None:
        self._factory.connections += 1
        assert self.transport is not None  # connected
        try:
            self.transport.setTcpNoDelay(True)  # answers go out as written, never held for an ACK
        except OSError:
            pass
        if self._factory.firstByteTimeout > 0:
            self._idle = self._factory.clock.callLater(self._factory.firstByteTimeout, self._silent)

    def _silent(self) -> None:
        self._idle = None
        if self._inner is None and self.transport is not None:
            self.transport.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        inner = self._inner
        if inner is not None:
            inner.dataReceived(data)
            return
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        inner = self._factory.choose(data[0], self._addr)
        if inner is None:
            self.transport.abortConnection()  # type: ignore[union-attr]
            return
        self._inner = inner
        assert self.transport is not None
        inner.makeConnection(self.transport)
        inner.dataReceived(data)

    def connectionLost(self, reason: Failure = _CLOSED) -> None:
        self._factory.connections -= 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._inner is not None:
            inner, self._inner = self._inner, None
            inner.connectionLost(reason)


class PersonalityFactory(ServerFactory):
    """Builds a ``PersonalitySwitch`` per connection; holds the plaintext and TLS factories."""

    log = Logger()
    noisy = False

    def __init__(
        self,
        clock: IReactorTime,
        plaintext: IProtocolFactory,
        tls: Callable[[IAddress], IProtocol | None] | None = None,
        loopbackOnly: bool = False,
        maxConnections: int = 4096,
        firstByteTimeout: float = 30.0,
    ) -> None:
        self.clock = clock
        self.plaintext = plaintext
        self.tls = tls
        self.loopbackOnly = loopbackOnly
        self.maxConnections = maxConnections
        self.firstByteTimeout = firstByteTimeout
        self.connections = 0
        self.refused = 0

    def startFactory(self) -> None:
        self.plaintext.doStart()

    def stopFactory(self) -> None:
        self.plaintext.doStop()

    def buildProtocol(self, addr: IAddress | None) -> Protocol | None:
        if self.connections >= self.maxConnections:
            self.refused += 1
            return None
        assert addr is not None
        return PersonalitySwitch(self, addr)

    def choose(self, firstByte: int, addr: IAddress) -> IProtocol | None:
        """The inner protocol for a connection whose first byte is ``firstByte``."""
        if firstByte == TLS_HANDSHAKE:
            if self.tls is None or self.loopbackOnly:
                return None
            return self.tls(addr)
        if not isLoopback(addr):
            return None
        return self.plaintext.buildProtocol(addr)
