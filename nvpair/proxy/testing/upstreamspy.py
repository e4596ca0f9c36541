"""A spy for the proxy's connector to nodes (``interfaces.IUpstream``), shaped like treq's
agent spy: ``upstreamSpy(clock)`` returns the provider and the list of ``UpstreamCall``
records it appends to, one per request, which the test answers by hand.

    upstream, calls = upstreamSpy(clock)
    ...                                  # the code under test calls upstream.request(...)
    response = calls[0].respond(200)     # headers arrive
    response.send(b"data: x\\n\\n")      # body bytes, then
    response.end()                       # a clean end (or .fail(): the connection died)

Everything runs on the given clock: no sockets, no real time.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from twisted.internet import defer
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.interfaces import IProtocol, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.interfaces import IConnectionPool, IPooledConnection
from nvpair.proxy.interfaces import IUpstream
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.wire import TCPStringTransport

__all__ = [
    "BodyTransport",
    "FakeResponse",
    "NoPool",
    "UpstreamCall",
    "UpstreamSpy",
    "upstreamSpy",
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
        clock: IReactorTime,
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
        if self.ended:
            return
        if self.protocol is None:
            raise AssertionError(
                "end() before anyone asked for the body: the code under test has not "
                "called deliverBody yet (fire the response first, and let it commit)"
            )
        self.ended = True
        self.protocol.connectionLost(Failure(ResponseDone()))

    def fail(self) -> None:
        """The connection died mid-body."""
        if not self.ended and self.protocol is not None:
            self.ended = True
            self.protocol.connectionLost(Failure(ResponseFailed([Failure(ConnectionLost())])))


@attrs.define
class CallState:
    """What happened to one call since it was made (the record itself never changes)."""

    cancelled: bool = False
    response: FakeResponse | None = None


@attrs.frozen
class UpstreamCall:
    """One ``IUpstream.request`` made through the spy: its arguments, the Deferred its caller
    waits on, and the ways a test answers it."""

    clock: IReactorTime
    node: Node | None
    address: str | None
    method: bytes
    path: bytes
    headers: Headers
    body: bytes
    connected: Callable[[], None] | None
    deferred: defer.Deferred[IResponse]
    state: CallState

    @property
    def cancelled(self) -> bool:
        """Whether the caller cancelled the request's Deferred."""
        return self.state.cancelled

    @property
    def response(self) -> FakeResponse | None:
        """The response ``respond`` fired the request with, if it did."""
        return self.state.response

    @property
    def nodeId(self) -> str:
        """The id of the node the request went to."""
        if self.node is None:
            raise AssertionError(
                f"this call to {self.address!r} names no node: read .address instead"
            )
        return self.node.id

    def _unanswered(self, what: str) -> None:
        if self.deferred.called:
            raise AssertionError(
                f"{what}: the request was already answered or cancelled "
                f"(cancelled={self.cancelled}); answer each call once, or check .pending()"
            )

    def connect(self) -> UpstreamCall:
        """The dial succeeded (the caller's ``connected`` runs, if it gave one)."""
        if self.connected is not None:
            self.connected()
        return self

    def respond(
        self,
        code: int = 200,
        headers: dict[bytes, list[bytes]] | None = None,
        length: int | None = None,
        phrase: bytes = b"Phrase",
    ) -> FakeResponse:
        """Headers arrived: fire the request with a response whose body is still to come."""
        self._unanswered("respond()")
        self.connect()
        response = self.state.response = FakeResponse(self.clock, code, headers, length, phrase)
        self.deferred.callback(response)
        return response

    def answer(self, code: int = 200, *chunks: bytes) -> FakeResponse:
        """A whole answer at once: headers, these chunks, EOF."""
        response = self.respond(code)
        response.send(*chunks)
        response.end()
        return response

    def respondRaw(self, *reads: bytes) -> HTTPClientConnection:
        """The engine answers with these raw bytes (one read each), parsed by the real
        upstream client on an in-memory transport; more reads go to the connection."""
        self._unanswered("respondRaw()")
        self.connect()
        conn = HTTPClientConnection(NoPool(), ("http", b"e", 1))
        conn.makeConnection(TCPStringTransport())
        sent: defer.Deferred[IResponse] = defer.Deferred()
        sent.addCallbacks(self.deferred.callback, self.deferred.errback)
        conn.send(b"", self.method, sent)
        for data in reads:
            conn.dataReceived(data)
        return conn

    def refuse(self) -> None:
        """The dial failed (connection refused)."""
        self._unanswered("refuse()")
        self.deferred.errback(ConnectionRefusedError())

    def drop(self) -> None:
        """The connection died before any headers."""
        self._unanswered("drop()")
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

    def bytesAfterAnswer(self, conn: IPooledConnection) -> None:
        pass


@implementer(IUpstream)
class UpstreamSpy:
    """Records every request as an ``UpstreamCall`` in ``calls``; each is answered by the
    test, or at once by ``auto`` when set."""

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.calls: list[UpstreamCall] = []
        self.auto: Callable[[UpstreamCall], object] | None = None

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
        state = CallState()

        def cancel(_: object) -> None:
            state.cancelled = True

        deferred: defer.Deferred[IResponse] = defer.Deferred(cancel)
        call = UpstreamCall(
            self.clock, node, address, method, path, headers, body, connected, deferred, state
        )
        self.calls.append(call)
        if self.auto is not None:
            self.auto(call)
        return deferred

    def pending(self) -> list[UpstreamCall]:
        """Calls not yet answered (nor cancelled)."""
        return [c for c in self.calls if not c.deferred.called]

    def last(self) -> UpstreamCall:
        """The latest call."""
        if not self.calls:
            raise AssertionError(
                "no request went through the upstream spy yet: is it the context's "
                "upstream, and did the exchange start (or its backoff elapse on the clock)?"
            )
        return self.calls[-1]

    def nodesCalled(self) -> list[str]:
        """The node ids of every call, in order."""
        return [c.nodeId for c in self.calls]


def upstreamSpy(clock: IReactorTime) -> tuple[UpstreamSpy, list[UpstreamCall]]:
    """An ``IUpstream`` on ``clock`` and the list it appends an ``UpstreamCall`` to for each
    request made through it."""
    spy = UpstreamSpy(clock)
    return spy, spy.calls
