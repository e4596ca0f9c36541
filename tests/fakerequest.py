"""The client's side of one request, faked for the exchange tests: ``FakeRequest`` is what an
``Exchange`` uses of ``http.request.ServerRequest`` (``IClientRequest``), and its connection
(``request.channel.transport``) records whether the proxy closed or aborted it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import IAddress, IPushProducer, ITransport
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.dispatch.interfaces import IClientRequest


@implementer(ITransport)
class ClientTransport:
    """The client's connection under a ``FakeRequest`` (``request.channel.transport``)."""

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

    def write(self, data: bytes) -> None:
        raise AssertionError("the answer is written through the request")

    def writeSequence(self, data: Iterable[bytes]) -> None:
        raise AssertionError("the answer is written through the request")

    def getPeer(self) -> IAddress:
        return IPv4Address("TCP", "127.0.0.1", 40000)

    def getHost(self) -> IAddress:
        return IPv4Address("TCP", "127.0.0.1", 8080)


@implementer(IClientRequest)
class FakeRequest:
    """The client's side of one request, as ``Exchange`` uses ``http.request.ServerRequest``."""

    def __init__(
        self,
        method: bytes = b"POST",
        path: bytes = b"/v1/chat/completions",
        headers: dict[bytes, list[bytes]] | None = None,
    ) -> None:
        self.method = method
        self.uri = path
        self.path = path.split(b"?", 1)[0]
        self.requestHeaders = Headers(headers or {b"content-type": [b"application/json"]})
        self.responseHeaders = Headers()
        self.content: io.BytesIO | None = None
        self.code: int | None = None
        self.phrase: bytes | None = None
        self.written: list[bytes] = []
        self.finished = False
        self.aborted = False
        self.closed = False
        self._disconnected = False
        self._onLost: Callable[[Failure], object] | None = None
        self.producer: IPushProducer | None = None
        self.channel: Protocol | None = Protocol()
        self.channel.makeConnection(ClientTransport(self))

    # request API
    def whenLost(self, callback: Callable[[Failure], object]) -> None:
        self._onLost = callback

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code
        self.phrase = message

    def write(self, data: bytes) -> None:
        if not self._disconnected:
            self.written.append(data)

    def finish(self) -> None:
        if self._disconnected:
            raise RuntimeError("finish after the connection was lost")
        assert not self.finished, "finished twice"
        self.finished = True
        self._onLost = None

    def registerProducer(self, producer: IPushProducer, streaming: bool) -> None:
        assert self.producer is None, "a producer is already registered"
        assert streaming
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    @property
    def disconnected(self) -> bool:
        return self._disconnected

    # test controls
    @property
    def body(self) -> bytes:
        return b"".join(self.written)

    def header(self, name: bytes) -> Sequence[bytes] | None:
        return self.responseHeaders.getRawHeaders(name)

    def lose(self) -> None:
        """The client connection went away (as the channel reports it)."""
        if self._disconnected:
            return
        self._disconnected = True
        if self.producer is not None:
            self.producer.stopProducing()
        onLost, self._onLost = self._onLost, None
        if onLost is not None:
            onLost(Failure(ConnectionLost()))

    def pause(self) -> None:
        """The client's socket buffer filled up."""
        assert self.producer is not None
        self.producer.pauseProducing()

    def resume(self) -> None:
        assert self.producer is not None
        self.producer.resumeProducing()
