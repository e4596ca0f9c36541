"""In-memory HTTP exchanges with a facade site: raw request bytes in, raw answer bytes out."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure


def siteExchange(site: Any, raw: bytes, host: str = "127.0.0.1") -> bytes:
    """Feed ``raw`` to a new connection of ``site`` from ``host``; return what it wrote."""
    channel = site.buildProtocol(IPv4Address("TCP", host, 5555))
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    value: bytes = transport.value()
    channel.connectionLost(Failure(ConnectionDone()))
    return value
