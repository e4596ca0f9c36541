"""The client's side of one request, faked for the exchange tests: ``FakeRequest`` provides
``IServerRequest`` as ``http.request.ServerRequest`` does, and its connection
(``request.channel.transport``) records whether the proxy closed or aborted it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import IProducer, IPushProducer
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.http.interfaces import IServerChannel, IServerRequest, IStreamTransport
from nvpair.proxy.http.refusal import Refusal


@implementer(IStreamTransport)
class ClientTransport:
    """The client's connection under a ``FakeRequest`` (``request.channel.transport``): a
    close or an abort is recorded on the request and loses it."""

    def __init__(self, request: FakeRequest) -> None:
        self.request = request

    @property
    def disconnected(self) -> bool:
        return self.request.disconnected

    def abortConnection(self) -> None:
        self.request.aborted = True
        self.request.lose()

    def loseConnection(self) -> None:
        """A graceful close: what was written is flushed first (kept in ``written``)."""
        self.request.closed = True
        self.request.lose()

    def loseWriteConnection(self) -> None:
        self.loseConnection()

    # The answer is written, and its producer registered, through the request.
    def write(self, data: bytes) -> None:
        raise AssertionError("written through the request")

    def writeSequence(self, data: Iterable[bytes]) -> None:
        raise AssertionError("written through the request")

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        raise AssertionError("registered through the request")

    def unregisterProducer(self) -> None:
        raise AssertionError("unregistered through the request")

    # Reading requests is the HTTP layer's business.
    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        self.loseConnection()

    def getTcpNoDelay(self) -> bool:
        return True

    def setTcpNoDelay(self, enabled: bool) -> None:
        pass

    def getTcpKeepAlive(self) -> bool:
        return False

    def setTcpKeepAlive(self, enabled: bool) -> None:
        pass

    def getPeer(self) -> IPv4Address:
        return IPv4Address("TCP", "127.0.0.1", 40000)

    def getHost(self) -> IPv4Address:
        return IPv4Address("TCP", "127.0.0.1", 8080)


@implementer(IServerChannel)
class FakeChannel:
    """The client connection a ``FakeRequest`` arrived on."""

    def __init__(self, request: FakeRequest) -> None:
        self.transport: IStreamTransport | None = ClientTransport(request)

    def send(self, data: bytes) -> None:
        raise AssertionError("written through the request")

    def requestDone(self, request: IServerRequest) -> None:
        pass

    def queue(self, size: int, item: IServerRequest | Refusal) -> None:
        raise AssertionError("the fake channel reads no requests")


@implementer(IServerRequest)
class FakeRequest:
    """The client's side of one request, as an ``Exchange`` uses ``http.request.ServerRequest``:
    what it writes is kept whole in ``written`` (unframed), and ``code`` stays None until a
    status is set."""

    def __init__(
        self,
        method: bytes = b"POST",
        path: bytes = b"/v1/chat/completions",
        headers: dict[bytes, list[bytes]] | None = None,
    ) -> None:
        self.method = method
        self.uri = path
        self.path = path.split(b"?", 1)[0]
        self.clientproto = b"HTTP/1.1"
        self.requestHeaders = Headers(headers or {b"content-type": [b"application/json"]})
        self.responseHeaders = Headers()
        self.content: io.BytesIO | None = None
        self.tooLarge = False
        self.persistent = True
        self.code: int | None = None
        self.code_message = b""
        self.startedWriting = False
        self.written: list[bytes] = []
        self.finished = False
        self.disconnected = False
        self.aborted = False
        self.closed = False
        self.producer: IProducer | None = None
        self.channel: IServerChannel | None = FakeChannel(self)
        self._onLost: Callable[[Failure], object] | None = None
        self._notifications: list[defer.Deferred[None]] = []

    # -- the request (``IServerRequest``) ----------------------------------------------

    def getHeader(self, name: bytes) -> bytes | None:
        values = self.requestHeaders.getRawHeaders(name)
        return values[-1] if values else None

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code
        self.code_message = message or b""

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.responseHeaders.setRawHeaders(name, [value])

    def write(self, data: bytes) -> None:
        self.startedWriting = True
        if not self.disconnected:
            self.written.append(data)

    def finish(self) -> None:
        if self.disconnected:
            raise RuntimeError("finish after the connection was lost")
        assert not self.finished, "finished twice"
        self.finished = True
        self._onLost = None
        notifications, self._notifications = self._notifications, []
        for d in notifications:
            d.callback(None)

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        assert self.producer is None, "a producer is already registered"
        assert streaming
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    def notifyFinish(self) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred()
        self._notifications.append(d)
        return d

    def whenLost(self, callback: Callable[[Failure], object]) -> None:
        self._onLost = callback

    def connectionLost(self, reason: Failure) -> None:
        """The client connection closed before the response finished."""
        self.disconnected = True
        onLost, self._onLost = self._onLost, None
        if onLost is not None:
            onLost(reason)
        notifications, self._notifications = self._notifications, []
        for d in notifications:
            d.errback(reason)

    # -- test controls --------------------------------------------------------------------

    @property
    def body(self) -> bytes:
        return b"".join(self.written)

    def header(self, name: bytes) -> Sequence[bytes] | None:
        return self.responseHeaders.getRawHeaders(name)

    def lose(self) -> None:
        """The client connection went away: its transport stops the registered producer,
        then the request hears of the loss (as from the channel)."""
        if self.disconnected:
            return
        self.disconnected = True
        if self.producer is not None:
            self.producer.stopProducing()
        self.connectionLost(Failure(ConnectionLost()))

    def pause(self) -> None:
        """The client's socket buffer filled up."""
        assert self.producer is not None
        IPushProducer(self.producer).pauseProducing()

    def resume(self) -> None:
        assert self.producer is not None
        IPushProducer(self.producer).resumeProducing()
