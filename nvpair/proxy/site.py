"""The HTTP surface of a facade: request limits, generated errors, and routing by route class.

``FacadeSite`` reads request bodies up to ``--max-body`` (413 beyond, read and dropped in
constant memory), answers oversized header blocks with 431, cuts clients that take longer
than ``--header-read-timeout`` to send their headers, and hands each request to the
facade's ``FrontDoor``.  Between requests, and while a request body is arriving, a
client connection idle for the header-read timeout is closed (twisted.web suspends that
idle timer while a response is being produced, so long streams are unaffected).
"""

from __future__ import annotations

import io
from typing import Any

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import Resource

from nvpair.proxy.engines import Engine
from nvpair.proxy.fastwrite import sendNow

_CLOSED = Failure(ConnectionDone())

_PHRASES = {
    400: b"Bad Request",
    403: b"Forbidden",
    413: b"Payload Too Large",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


def sendError(
    request: Any,
    engine: Engine,
    status: int,
    reason: str,
    message: str,
    retryAfter: int | None = None,
) -> None:
    """Answer with a response the proxy generates, in the engine's shape, without CORS headers."""
    body = engine.errorBody(request.path, reason, message)
    request.setResponseCode(status, _PHRASES.get(status))
    headers = request.responseHeaders
    for name, _ in list(headers.getAllRawHeaders()):
        if name.lower().startswith(b"access-control-"):
            headers.removeHeader(name)
    headers.setRawHeaders(b"content-type", [b"application/json"])
    headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
    headers.setRawHeaders(b"date", [http.datetimeToString()])
    if retryAfter is not None:
        headers.setRawHeaders(b"retry-after", [b"%d" % retryAfter])
    request.write(body)
    request.finish()


class FacadeRequest(server.Request):
    """A request whose body is held in memory up to the site's limit and dropped beyond it."""

    defaultContentType = None
    tooLarge = False
    _received = 0
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Bodies are JSON for the engine, not form submissions: never parse them here (the
        # base __init__ sets this per instance, so a class attribute would not do).
        self._parsePOSTFormSubmission = False

    def process(self) -> None:
        """Hand the request straight to the facade's front door: no resource traversal and
        no default ``Server``/``Date`` headers (a proxied answer carries the engine's own)."""
        site = self.site = self.channel.site  # type: ignore[attr-defined]
        site.resource.render(self)

    def write(self, data: bytes) -> None:
        super().write(data)
        flush = getattr(self.channel, "flushHead", None)
        if flush is not None:
            flush()

    def gotLength(self, length: int | None) -> None:
        self.content = io.BytesIO()
        limit = self._site().maxBody
        if length is not None and length > limit:
            self.tooLarge = True

    def handleContentChunk(self, data: bytes) -> None:
        if self.tooLarge:
            return
        self._received += len(data)
        if self._received > self._site().maxBody:
            self.tooLarge = True
            self.content = io.BytesIO()
            return
        content: io.BytesIO = self.content  # type: ignore[assignment]
        content.write(data)

    def _site(self) -> FacadeSite:
        site: FacadeSite = self.channel.site  # type: ignore[attr-defined]
        return site


class FacadeChannel(http.HTTPChannel):
    """HTTP/1.1 channel with a header-read deadline and 431 for oversized header blocks."""

    # The header-read deadline is kept as a time; one timer per connection checks it, and
    # is only rescheduled when it fires early.  Arming and disarming it per request costs
    # an attribute store, not a callLater and a cancel.
    _headerTimer: IDelayedCall | None = None
    _headerDeadline: float | None = None
    site: FacadeSite

    def connectionMade(self) -> None:
        super().connectionMade()
        self._armHeaderTimer()

    def _armHeaderTimer(self) -> None:
        timeout = self.site.headerReadTimeout
        if timeout > 0 and self._headerDeadline is None:
            self._headerDeadline = self.site.clock.seconds() + timeout
            if self._headerTimer is None:
                self._headerTimer = self.site.clock.callLater(timeout, self._checkHeaderTimer)

    def _disarmHeaderTimer(self) -> None:
        self._headerDeadline = None

    def _cancelHeaderTimer(self) -> None:
        self._headerDeadline = None
        if self._headerTimer is not None:
            if self._headerTimer.active():
                self._headerTimer.cancel()
            self._headerTimer = None

    def _checkHeaderTimer(self) -> None:
        self._headerTimer = None
        deadline = self._headerDeadline
        if deadline is None:
            return  # disarmed meanwhile; the next arming starts a timer again
        left = deadline - self.site.clock.seconds()
        if left > 0:
            self._headerTimer = self.site.clock.callLater(left, self._checkHeaderTimer)
            return
        self._headersTooSlow()

    def _headersTooSlow(self) -> None:
        self._headerDeadline = None
        self.site.slowClients += 1
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # The response head is held until the body write that follows it within the same
    # ``Request.write`` and leaves with it in one send (``FacadeRequest.write`` flushes a
    # head that no body follows, e.g. HEAD, 204, or an empty write that pushes headers).
    _head: bytes | None = None

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Any) -> None:
        parts = [version, b" ", code, b" ", reason, b"\r\n"]
        for name, values in headers.getAllRawHeaders():
            for value in values:
                parts.extend((name, b": ", value, b"\r\n"))
        parts.append(b"\r\n")
        self.flushHead()
        self._head = b"".join(parts)

    def flushHead(self) -> None:
        """Send a held response head now."""
        head = self._head
        if head is not None:
            self._head = None
            sendNow(self.transport, head)

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            data = head + data
        sendNow(self.transport, data)

    def writeSequence(self, iovec: Any) -> None:
        head = self._head
        if head is not None:
            self._head = None
            sendNow(self.transport, b"".join([head, *iovec]))
        else:
            sendNow(self.transport, b"".join(iovec))

    def allHeadersReceived(self) -> None:
        self._disarmHeaderTimer()
        super().allHeadersReceived()

    def requestDone(self, request: Any) -> None:
        super().requestDone(request)
        if not self.requests:
            self._armHeaderTimer()

    def connectionLost(self, reason: Failure = _CLOSED) -> None:
        self._cancelHeaderTimer()
        super().connectionLost(reason)

    def _respondToBadRequestAndDisconnect(self) -> None:
        if self._receivedHeaderSize > self.totalHeadersSize or (
            self._receivedHeaderCount > self.maxHeaders
        ):
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            self.loseConnection()
            return
        super()._respondToBadRequestAndDisconnect()


class FacadeResource(Resource):
    """The one resource of a facade site: everything goes to the front door."""

    isLeaf = True
    log = Logger()

    def __init__(self, door: Any) -> None:
        super().__init__()
        self._door = door

    def render(self, request: Any) -> int:
        try:
            self._door.handle(request)
        except Exception as e:
            self._door.crashed(request, e)
        return server.NOT_DONE_YET


class FacadeSite(server.Site):
    """The twisted.web site of one facade personality (plaintext or peer TLS)."""

    requestFactory = FacadeRequest
    protocol = FacadeChannel  # type: ignore[assignment]
    noisy = False

    def __init__(
        self,
        door: Any,
        clock: IReactorTime,
        maxBody: int,
        headerReadTimeout: float,
        maxHeaderBytes: int,
    ) -> None:
        super().__init__(
            FacadeResource(door), timeout=headerReadTimeout or None, reactor=clock
        )
        self.clock = clock
        self.maxBody = maxBody
        self.headerReadTimeout = headerReadTimeout
        self.maxHeaderBytes = maxHeaderBytes
        self.slowClients = 0
        self.sessionCheckTime = 0

    def buildProtocol(self, addr: Any) -> Any:
        channel = super().buildProtocol(addr)
        channel.totalHeadersSize = self.maxHeaderBytes
        return channel

    def getResourceFor(self, request: Any) -> Any:
        request.site = self
        return self.resource

    def log(self, request: Any) -> None:
        """Access logging is the proxy's own business (never request content)."""
