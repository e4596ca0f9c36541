"""In-memory fakes for unit tests of the request path: upstream, responses, client, context.

``FakeUpstream`` records every request as a ``Call`` whose Deferred the test fires by hand;
``FakeResponse`` delivers body bytes, EOF and failures when told; the client side is
``tests.support.fakerequest.FakeRequest``, and the context an ``Exchange`` reports to is
``tests.support.fakecontext.FakeContext``.
Everything runs on a ``Clock``: no sockets, no real time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.interfaces import IProtocol, IPushProducer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair.proxy.dispatch.exchange import Exchange
from nvpair.proxy.dispatch.interfaces import IFacadeView
from nvpair.proxy.engines import ENGINES
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.interfaces import IConnectionPool, IPooledConnection
from nvpair.proxy.interfaces import IBrokerSink, IRequestContext, IUpstream
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.settings import Settings
from tests.support.fakerequest import FakeRequest

RUN_ID = "0123456789abcdef"


def makeSettings(**overrides: Any) -> Settings:
    """Settings with the protocol defaults (durations in seconds), overridden as given."""
    values: dict[str, Any] = dict(
        stateDir="/nonexistent",
        clusterDir=None,
        responseHeaderTimeout=1800.0,
        jobDeadline=600.0,
        dialTimeout=10.0,
        maxDispatchAttempts=5,
        backoffBase=0.25,
        backoffMax=5.0,
        clientWriteTimeout=60.0,
        retryAfter=10,
        maxBody=1 << 26,
        logLevel="info",
        opsPort=None,
        standalone=False,
        backends=(),
        engines=("ollama", "lmstudio", "llamacpp"),
        maxConnections=4096,
        headerReadTimeout=30.0,
        maxHeaderBytes=65536,
        streamIdleTimeout=0.0,  # the stall watch is off unless a test turns it on
    )
    values.update(overrides)
    return Settings(**values)


@implementer(IBrokerSink)
class ListSink:
    """Records notifications."""

    listening = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))

    def workloadEvents(self) -> list[tuple[str, dict[str, Any]]]:
        """(method, workloadInfo) of every workload event, in order."""
        return [(m, p["workloadInfo"]) for m, p in self.sent if m.startswith("workload:")]

    def activity(self) -> list[tuple[str, int]]:
        """(nodeId, inFlight) of every ``discovery:node-activity``, in order."""
        return [
            (p["nodeId"], p["inFlight"]) for m, p in self.sent if m == "discovery:node-activity"
        ]


@implementer(IPushProducer)
class BodyTransport:
    """The transport a response body protocol sees: records flow control."""

    def __init__(self, response: FakeResponse) -> None:
        self.response = response
        self.paused = False
        self.pauses = 0
        self.stopped = False

    def pauseProducing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False

    def stopProducing(self) -> None:
        """Like closing the upstream connection: the body ends with a failure, a turn later."""
        if self.stopped:
            return
        self.stopped = True
        self.response.clock.callLater(0, self.response.fail)


@implementer(IResponse)
class FakeResponse:
    """An ``IResponse`` whose body the test delivers by hand."""

    version = (b"HTTP", 1, 1)
    request = None
    previousResponse = None

    def __init__(
        self,
        clock: Clock,
        code: int,
        headers: dict[bytes, list[bytes]] | None = None,
        length: int | None = None,
        phrase: bytes = b"Phrase",
    ) -> None:
        self.clock = clock
        self.code = code
        self.phrase = phrase
        self.headers = Headers(headers or {b"content-type": [b"text/event-stream"]})
        self.length: int | object = UNKNOWN_LENGTH if length is None else length
        self.protocol: IProtocol | None = None
        self.transport = BodyTransport(self)
        self.ended = False

    def deliverBody(self, protocol: IProtocol) -> None:
        self.protocol = protocol
        # A body protocol's transport is the response's producer, not an ``ITransport``.
        protocol.makeConnection(self.transport)  # type: ignore[arg-type]

    def setPreviousResponse(self, response: IResponse) -> None:
        pass

    def send(self, *chunks: bytes) -> None:
        """Deliver body chunks (dropped once the body ended, as a closed connection would)."""
        for chunk in chunks:
            if not self.ended and self.protocol is not None:
                self.protocol.dataReceived(chunk)

    def end(self) -> None:
        """The body ended cleanly."""
        if not self.ended:
            self.ended = True
            assert self.protocol is not None, "the body was never delivered"
            self.protocol.connectionLost(Failure(ResponseDone()))

    def fail(self) -> None:
        """The connection died mid-body."""
        if not self.ended and self.protocol is not None:
            self.ended = True
            self.protocol.connectionLost(Failure(ResponseFailed([Failure(ConnectionLost())])))


class Call:
    """One request the fake upstream received; the test answers it."""

    def __init__(
        self,
        upstream: FakeUpstream,
        node: Node | None,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None,
    ) -> None:
        self.upstream = upstream
        self.node = node
        self.address = address
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self._connected = connected
        self.cancelled = False
        self.response: FakeResponse | None = None
        # Fires with a ``FakeResponse``, or (``respondRaw``) the real upstream client's.
        self.deferred: defer.Deferred[IResponse] = defer.Deferred(self._cancel)

    def _cancel(self, _: object) -> None:
        self.cancelled = True

    @property
    def nodeId(self) -> str:
        assert self.node is not None
        return self.node.id

    def connect(self) -> Call:
        """The dial succeeded."""
        if self._connected is not None:
            self._connected()
        return self

    def respond(
        self,
        code: int = 200,
        headers: dict[bytes, list[bytes]] | None = None,
        length: int | None = None,
    ) -> FakeResponse:
        """Headers arrived: fire the request with a response whose body is still to come."""
        self.connect()
        self.response = FakeResponse(self.upstream.clock, code, headers, length)
        self.deferred.callback(self.response)
        return self.response

    def answer(self, code: int = 200, *chunks: bytes) -> FakeResponse:
        """A whole answer at once: headers, these chunks, EOF."""
        response = self.respond(code)
        response.send(*chunks)
        response.end()
        return response

    def respondRaw(self, *reads: bytes) -> HTTPClientConnection:
        """The engine answers with these raw bytes (one read each), parsed by the real
        upstream client on an in-memory transport; more reads go to the connection."""
        self.connect()
        conn = HTTPClientConnection(NoPool(), ("http", b"e", 1))
        conn.makeConnection(StringTransport())
        sent: defer.Deferred[IResponse] = defer.Deferred()
        sent.addCallbacks(self.deferred.callback, self.deferred.errback)
        conn.send(b"", self.method, sent)
        for data in reads:
            conn.dataReceived(data)
        return conn

    def refuse(self) -> None:
        """The dial failed (connection refused)."""
        self.deferred.errback(ConnectionRefusedError())

    def drop(self) -> None:
        """The connection died before any headers."""
        self.connect()
        self.deferred.errback(ResponseFailed([Failure(ConnectionLost())]))


@implementer(IConnectionPool)
class NoPool:
    """The pool of a ``respondRaw`` connection: keeps nothing."""

    def release(self, conn: IPooledConnection) -> None:
        if conn.transport is not None:
            conn.transport.loseConnection()

    def lost(self, conn: IPooledConnection) -> None:
        pass


@implementer(IUpstream)
class FakeUpstream:
    """Records requests; each is answered by the test (or by ``auto`` when set)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[Call] = []
        self.auto: Callable[[Call], object] | None = None

    def request(
        self,
        node: Node | None,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[IResponse]:
        call = Call(self, node, address, method, path, headers, body, connected)
        self.calls.append(call)
        if self.auto is not None:
            self.auto(call)
        return call.deferred

    def pending(self) -> list[Call]:
        """Calls not yet answered (nor cancelled)."""
        return [c for c in self.calls if not c.deferred.called]

    def last(self) -> Call:
        return self.calls[-1]

    def nodesCalled(self) -> list[str]:
        return [c.nodeId for c in self.calls]


def node(
    nodeId: str,
    models: tuple[str, ...] = ("m1",),
    isSelf: bool = False,
    addresses: tuple[str, ...] | None = None,
) -> Node:
    """A discovery node reached directly at ``http://<id>``."""
    if addresses is None:
        addresses = (f"http://{nodeId}",)
    return Node(nodeId, isSelf, addresses, frozenset(models))


def makeFacade(clock: Clock, nodes: list[Node], engine: str = "llamacpp") -> Facade:
    """A facade (never listening) holding a snapshot of ``nodes``."""
    e = ENGINES[engine]
    facade = Facade(e, clock, lambda aliasOnly: None, Snapshot((), e.normalize))  # type: ignore[arg-type, return-value]
    facade.setSnapshot(Snapshot(nodes, e.normalize))
    return facade


def setNodes(facade: Facade, nodes: list[Node]) -> None:
    """Replace the facade's discovery snapshot."""
    facade.setSnapshot(Snapshot(nodes, facade.engine.normalize))


CHAT = b'{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def startExchange(
    context: IRequestContext,
    facade: IFacadeView,
    request: FakeRequest | None = None,
    inference: bool = True,
    model: str | None = "m1",
    body: bytes = CHAT,
    document: dict[str, object] | None = None,
) -> tuple[Exchange, FakeRequest]:
    """Admit one request and start its dispatch loop."""
    request = request or FakeRequest()
    exchange = Exchange(context, facade, request, inference, model, body, document)
    exchange.start()
    return exchange, request
