"""Fakes and builders shared by the HTTP tests of this folder: the server side's doors,
connection and request builders (``test_httpserver_*``, ``test_strictrequests``), and the
client side's endpoint, body protocol and pooled-client test base (``test_httpclient_*``,
``test_strictresponse``)."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import (
    IProtocol,
    IProtocolFactory,
    IPushProducer,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair.proxy.engines import OLLAMA, Engine
from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.framing import serializeRequest
from nvpair.proxy.http.interfaces import IDoor, IServerRequest
from nvpair.proxy.http.pool import ConnectionPool
from nvpair.proxy.http.site import FacadeSite
from nvpair.proxy.testing.wire import TCPStringTransport, splitAnswer

# The server side: a facade site over a string transport, and the doors behind it.


@implementer(IDoor)
class Door:
    """Records requests (and their bodies); answers each with ``body`` at once unless
    ``hold`` is set."""

    engine: Engine | None = None

    def __init__(self, body: bytes = b"ok", hold: bool = False, length: bool = True) -> None:
        self.body = body
        self.hold = hold
        self.length = length
        self.requests: list[IServerRequest] = []
        self.bodies: list[bytes | None] = []
        self.crashes: list[Exception] = []

    def handle(self, request: IServerRequest) -> None:
        self.requests.append(request)
        self.bodies.append(None if request.content is None else request.content.getvalue())
        if not self.hold:
            answer(request, self.body, self.length)

    def crashed(self, request: IServerRequest, error: Exception) -> None:
        self.crashes.append(error)


class OllamaDoor(Door):
    """A door of the Ollama facade (its refusals use Ollama's error shape on ``/api/``)."""

    engine = OLLAMA


@implementer(IPushProducer)
class Producer:
    """A response body's producer that the test never asks anything of."""

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def answer(request: IServerRequest, body: bytes, length: bool = True) -> None:
    """Answer ``request`` with 200 and ``body``."""
    request.setResponseCode(200)
    if length:
        request.setHeader(b"content-length", b"%d" % len(body))
    request.write(body)
    request.finish()


class Connection:
    """A facade channel over a ``StringTransport`` with a fake clock."""

    def __init__(
        self, door: Door, maxBody: int = 1000, timeout: float = 30.0, maxHeaderBytes: int = 4096
    ) -> None:
        self.clock = Clock()
        self.refusals: list[str] = []
        self.site = FacadeSite(
            door, self.clock, maxBody, timeout, maxHeaderBytes, door.engine, self.refusals.append
        )
        self.channel = self.site.buildProtocol(None)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def send(self, data: bytes) -> bytes:
        self.channel.dataReceived(data)
        return self.take()

    def take(self) -> bytes:
        out: bytes = self.transport.value()
        self.transport.clear()
        return out

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)


GET = b"GET /v1/models?x=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n\r\n"


def post(body: bytes, path: bytes = b"/a", extra: bytes = b"") -> bytes:
    """A POST with a Content-Length body."""
    return b"POST %s HTTP/1.1\r\nHost: h\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path,
        extra,
        len(body),
        body,
    )


def chunkedPost(chunks: bytes, extra: bytes = b"") -> bytes:
    """A POST with a chunked body given already framed."""
    return b"POST /a HTTP/1.1\r\nHost: h\r\n%sTransfer-Encoding: chunked\r\n\r\n%s" % (
        extra,
        chunks,
    )


def answering() -> tuple[Connection, IServerRequest]:
    """A connection whose door holds the ``GET`` it received, unanswered."""
    door = Door(hold=True)
    conn = Connection(door)
    conn.send(GET)
    return conn, door.requests[0]


def errorOf(out: bytes) -> tuple[int, dict[str, bytes], Any]:
    """The status, headers (lower-case names) and JSON body of one error answer."""
    status, fields, body = splitAnswer(out)
    headers = {name.decode(): value for name, value in fields.items()}
    assert len(body) == int(headers["content-length"]), out
    return status, headers, json.loads(body)


# The client side: a pool dialling a fake endpoint, and a body protocol.

PEER = IPv4Address("TCP", "127.0.0.1", 8081)


@implementer(IStreamClientEndpoint)
class FakeEndpoint:
    """An endpoint whose dials the test completes (or fails) by hand."""

    def __init__(self) -> None:
        self.dials: list[tuple[IProtocolFactory, defer.Deferred[IProtocol]]] = []
        self.transportType: type[StringTransport] = TCPStringTransport
        self.transports: list[StringTransport] = []
        self.conns: list[HTTPClientConnection] = []

    def __call__(self) -> FakeEndpoint:
        return self

    def connect(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IProtocol]:
        d: defer.Deferred[IProtocol] = defer.Deferred()
        self.dials.append((protocolFactory, d))
        return d

    def complete(self, index: int = -1) -> tuple[HTTPClientConnection, StringTransport]:
        factory, d = self.dials[index]
        conn = factory.buildProtocol(PEER)
        assert isinstance(conn, HTTPClientConnection)
        transport = self.transportType()
        conn.makeConnection(transport)
        self.transports.append(transport)
        self.conns.append(conn)
        d.callback(conn)
        return conn, transport


CLOSED = Failure(ConnectionDone())


class Body(Protocol):
    """Collects a body and how it ended."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.reason: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data.append(data)

    def connectionLost(self, reason: Failure = CLOSED) -> None:
        self.reason = reason


KEY = ("http", b"e", 1)


class ClientCase(SynchronousTestCase):
    """A base without tests of its own: a pool (two idle connections per key, 90 s idle
    timeout) on a fake clock, dialling a ``FakeEndpoint``; requests and answers by hand."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.pool = ConnectionPool(self.clock, maxPersistentPerHost=2, idleTimeout=90)
        self.endpoint = FakeEndpoint()

    def send(
        self, method: bytes = b"POST", body: bytes | None = b"{}"
    ) -> defer.Deferred[IResponse]:
        data = serializeRequest(method, b"/v1/x", b"e:1", Headers({b"X-A": [b"1"]}), body)
        return self.pool.request(KEY, self.endpoint, data, method)

    def respond(
        self, raw: bytes, method: bytes = b"POST"
    ) -> tuple[IResponse, Body, StringTransport]:
        d = self.send(method)
        conn, transport = self.endpoint.complete()
        conn.dataReceived(raw)
        response = self.successResultOf(d)
        body = Body()
        response.deliverBody(body)
        return response, body, transport

    def connectionOf(self, transport: StringTransport) -> HTTPClientConnection:
        """The connection that ``transport`` carries."""
        return self.endpoint.conns[self.endpoint.transports.index(transport)]
