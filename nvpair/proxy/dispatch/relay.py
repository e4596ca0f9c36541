"""Relaying a response between engine and client: headers both ways, the body protocol at
the commit gate (``Relay``), and the client's flow control and ending.

The upstream body transport is registered as the client's producer through ``ClientFlow``:
when the client's socket buffer fills, the upstream read pauses (memory stays bounded);
when the client stays paused longer than the write deadline, the client is cut off.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair.proxy.dispatch.interfaces import IBodyGate
from nvpair.proxy.http.interfaces import IServerRequest, IStreamTransport

# Connection-scoped headers that never cross a proxy (RFC 9110 §7.6.1), plus the ones the
# client library recomputes for the other side.
HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"host",
        b"expect",  # the body is already buffered: no 100-continue round trip upstream
    )
)


_NO_TOKENS: frozenset[bytes] = frozenset()


def _connectionTokens(headers: Headers) -> frozenset[bytes]:
    """The field names a ``Connection`` header lists (lower case)."""
    values = headers.getRawHeaders(b"connection")
    if not values:
        return _NO_TOKENS
    tokens: set[bytes] = set()
    for value in values:
        tokens.update(t.strip().lower() for t in value.split(b","))
    return frozenset(tokens)


def forwardHeaders(incoming: Headers) -> Headers:
    """The request headers to send upstream: hop-by-hop, those ``Connection`` names, and
    Host removed.  The values are copied as they are (a ``Headers`` holds them sanitized).
    """
    named = _connectionTokens(incoming)
    out = Headers()
    for name, values in incoming.getAllRawHeaders():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in named:
            continue
        out.setRawHeaders(name, list(values))
    return out


def copyResponseHeaders(source: Headers, target: Headers, length: int | None) -> None:
    """Copy an upstream response's end-to-end headers onto the client response.

    The hop-by-hop set is removed here whatever ``source`` holds (the upstream client has
    already removed it and the fields its ``Connection`` named).  The client response's
    ``Content-Length`` is ``length`` (the engine's), or absent.
    """
    target.removeHeader(b"Server")
    target.removeHeader(b"Date")
    for name, values in source.getAllRawHeaders():
        lower = name.lower()
        if lower in HOP_BY_HOP:
            continue
        target.setRawHeaders(name, values)
    if length is not None:
        target.setRawHeaders(b"Content-Length", (b"%d" % length,))


_ENGINE_OWNED = (b"server", b"date")  # the engine's replace the proxy's


def adoptResponseHeaders(source: Headers, request: IServerRequest, length: int | None) -> None:
    """Make an upstream response's headers the client response's, without copying them.

    The same result as ``copyResponseHeaders`` onto ``request.responseHeaders`` (hop-by-hop
    fields removed, the engine's ``Server``/``Date``, fields already set on the client
    response kept unless the engine sent them too, ``Content-Length`` from ``length``), but
    ``source`` itself becomes ``request.responseHeaders``: it belongs to a response whose
    head is consumed at commit, and adopting it saves a copy per field on every request.
    """
    for name, _ in list(source.getAllRawHeaders()):
        if name.lower() in HOP_BY_HOP:
            source.removeHeader(name)
    for name, values in request.responseHeaders.getAllRawHeaders():
        if name.lower() not in _ENGINE_OWNED and not source.hasHeader(name):
            source.setRawHeaders(name, values)
    if length is not None:
        source.setRawHeaders(b"Content-Length", (b"%d" % length,))
    request.responseHeaders = source


@implementer(IPushProducer)
class ClientFlow:
    """The producer the client connection sees: forwards flow control to the upstream read."""

    __slots__ = ("_upstream", "_clock", "_writeTimeout", "_onDeadClient", "_timer", "paused")

    def __init__(
        self,
        upstream: IPushProducer,
        clock: IReactorTime,
        writeTimeout: float,
        onDeadClient: Callable[[], None],
    ) -> None:
        self._upstream = upstream
        self._clock = clock
        self._writeTimeout = writeTimeout
        self._onDeadClient = onDeadClient
        self._timer: IDelayedCall | None = None
        self.paused = False

    def pauseProducing(self) -> None:
        self.paused = True
        self._upstream.pauseProducing()
        if self._timer is None and self._writeTimeout > 0:
            self._timer = self._clock.callLater(self._writeTimeout, self._expired)

    def resumeProducing(self) -> None:
        self.paused = False
        self._cancelTimer()
        self._upstream.resumeProducing()

    def stopProducing(self) -> None:
        self._cancelTimer()
        self._upstream.stopProducing()

    def _cancelTimer(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        self._onDeadClient()

    def cancel(self) -> None:
        """Stop the write deadline (the stream ended)."""
        self._cancelTimer()


_DONE = Failure(ResponseDone())


def stopReceiving(protocol: Protocol) -> None:
    """Stop the body a protocol is receiving (its transport is the body's producer)."""
    # A body protocol's transport is the response's producer, not the ``ITransport`` that
    # Twisted's ``Protocol`` declares.
    transport: IPushProducer | None = protocol.transport  # type: ignore[assignment]
    if transport is not None:
        transport.stopProducing()


class Relay(Protocol):
    """Receives the response body: gate until the first byte, then stream to the client."""

    __slots__ = ("attempt", "committed")

    def __init__(self, attempt: IBodyGate) -> None:
        self.attempt = attempt
        self.committed = False

    def connectionMade(self) -> None:
        self.attempt.headersArrived()

    def dataReceived(self, data: bytes) -> None:
        if self.committed:
            self.attempt.exchange.write(data)
            return
        if self.attempt.commit():
            self.committed = True
            self.attempt.exchange.write(data)
        else:
            stopReceiving(self)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        self.attempt.bodyLost(reason)


def _clientTransport(request: IServerRequest) -> IStreamTransport | None:
    channel = request.channel
    return channel.transport if channel else None


def abortClient(request: IServerRequest) -> None:
    """Close the client connection at once, dropping anything still buffered for it."""
    transport = _clientTransport(request)
    if transport is None:
        return
    transport.abortConnection()


def truncateClient(request: IServerRequest, clock: IReactorTime, grace: float) -> None:
    """End a committed response that the upstream cut short, so the client sees it cut.

    The bytes already relayed are flushed first and the connection then closed without the
    response's end (no final chunk, or fewer bytes than its Content-Length); a client that
    does not take those bytes within ``grace`` seconds is aborted.
    """
    transport = _clientTransport(request)
    if transport is None:
        return
    transport.loseConnection()
    if grace > 0:
        clock.callLater(grace, _abortIfOpen, transport)


def _abortIfOpen(transport: IStreamTransport) -> None:
    if not getattr(transport, "disconnected", False):
        transport.abortConnection()


class _Discard(Protocol):
    """Reads and drops a body we will not forward; stops it if it is large or endless."""

    def __init__(self, limit: int, clock: IReactorTime) -> None:
        self._left = limit
        self._timer: IDelayedCall | None = None
        self._clock = clock

    def connectionMade(self) -> None:
        if self._left <= 0:
            stopReceiving(self)
            return
        self._timer = self._clock.callLater(10.0, stopReceiving, self)

    def dataReceived(self, data: bytes) -> None:
        self._left -= len(data)
        if self._left < 0:
            stopReceiving(self)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


def discard(response: IResponse, clock: IReactorTime, limit: int = 1 << 20) -> None:
    """Drain an unwanted response so its connection can be reused, within bounds."""
    response.deliverBody(_Discard(limit, clock))
