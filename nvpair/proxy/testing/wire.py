"""In-memory wire helpers: HTTP exchanges with a facade site, lines to and from a broker channel.

No sockets: the site's protocol runs on a ``StringTransport``, so a test sees the exact bytes
the proxy would put on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IProtocol, IProtocolFactory, ITCPTransport
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from zope.interface import implementer


@implementer(ITCPTransport)
class TCPStringTransport(StringTransport):
    """A ``StringTransport`` that is a TCP one, as the proxy's listeners are given: it
    records the no-delay and keep-alive switches, and a write-side close as a close."""

    noDelay = False
    keepAlive = False

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.noDelay = enabled

    def getTcpNoDelay(self) -> bool:
        return self.noDelay

    def setTcpKeepAlive(self, enabled: bool) -> None:
        self.keepAlive = enabled

    def getTcpKeepAlive(self) -> bool:
        return self.keepAlive

    def loseWriteConnection(self) -> None:
        self.loseConnection()


def siteExchange(site: IProtocolFactory, raw: bytes, host: str = "127.0.0.1") -> bytes:
    """Feed ``raw`` to a new connection of ``site`` from ``host``; return what it wrote."""
    channel = site.buildProtocol(IPv4Address("TCP", host, 5555))
    if channel is None:
        raise ValueError("the site refused the connection")
    transport = TCPStringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    value: bytes = transport.value()
    channel.connectionLost(Failure(ConnectionDone()))
    return value


def splitAnswer(answer: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, lower-cased headers and body of one HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(b" ")[1]), headers, body


def sendLine(channel: IProtocol, data: bytes | Mapping[str, object]) -> None:
    """Feed a broker channel raw bytes, or one message as a JSON line."""
    if isinstance(data, Mapping):
        data = json.dumps(data).encode() + b"\n"
    channel.dataReceived(data)


def drainLines(transport: StringTransport) -> tuple[bytes, list[dict[str, Any]]]:
    """Everything written since the last drain: the raw bytes and each line parsed.

    The messages are ``dict[str, Any]`` on purpose: tests reach straight into them.
    """
    raw: bytes = transport.value()
    transport.clear()
    return raw, [json.loads(line) for line in raw.splitlines()]
