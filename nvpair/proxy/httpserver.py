"""The server side of a facade connection: requests framed by llhttp, answered in order.

``ServerChannel`` is one client connection.  Its bytes go to an ``httptools``
``HttpRequestParser`` (llhttp, strict: no leniency is switched on).  The parser's callbacks
gather each head, apply ``requestrules``, keep the body up to the site's ``maxBody`` (beyond
it the body is read and dropped in constant memory and the request is flagged
``tooLarge``) and queue each complete request.  Queued requests go to the site's door one at
a time, in order.  llhttp cannot pause, so once the requests parsed ahead of the answer in
progress hold more than ``PIPELINE_HOLD`` bytes, the transport stops reading until that
answer ends (each read is at most 64 KiB, so what is held stays bounded).

Limits: llhttp has none of its own, so the callbacks count: a head over ``maxHeaderBytes``
or with more than ``MAX_HEADERS`` fields is answered 431, and so is a run of that many bytes
that completes no field (a header line without end).  Anything llhttp or the rules refuse
gets 400 (501 for a transfer coding other than chunked, 505 for another HTTP version).
Each error answer waits for the answers before it, is in the engine's error shape, and
closes the connection.  After a request that ends its connection (``Connection: close``,
HTTP/1.0) nothing more is parsed.  A client must send a whole head within
``headerReadTimeout`` of connecting or of its previous answer, and must not leave a body
idle for that long; otherwise it is cut.  No deadline runs while a request is answered.
"""

from __future__ import annotations

import io
from collections import deque
from typing import TYPE_CHECKING, NoReturn

from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
)
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.proxy.fastwrite import sendNow
from nvpair.proxy.requestrules import Refusal, checkHead, clientProtocol, headersOf, pathOf
from nvpair.proxy.serverrequest import HTTP11, ServerRequest

if TYPE_CHECKING:
    from nvpair.proxy.site import FacadeSite

_CLOSED = Failure(ConnectionDone())
MAX_HEADERS = 500
PIPELINE_HOLD = 1 << 16
REQUEST_LINE = 16  # the method, version, spaces and line ends around the target
QUEUED = 256  # what a queued request costs beyond its bytes
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEAD_TOO_LARGE = "the request head is larger than the proxy accepts"


class _Stop(Exception):
    """Raised from a callback to stop llhttp: nothing after this point is parsed."""


class ServerChannel(Protocol):
    """One facade client connection: parses requests and serves them one at a time."""

    log = Logger()

    def __init__(self, site: FacadeSite) -> None:
        self.site = site
        self._maxHead = site.maxHeaderBytes
        self._parser = HttpRequestParser(self)
        # The message being parsed: its head, then its body.
        self._inMessage = False
        self._inHead = False
        self._resuming = False  # a synthetic head that frames an upgrade request's body
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._headBytes = 0  # the request line and target as reported so far
        self._fieldBytes = 0  # the first ``_counted`` fields of a head still arriving
        self._counted = 0
        self._headRaw = 0  # the head's bytes read so far, when known
        self._trailerBytes = 0
        self._incoming: ServerRequest | None = None
        self._incomingBytes = 0
        self._parts: list[bytes] = []
        self._received = 0
        self._upgrade = False
        self._bodyLength = 0  # announced: -1 for chunked
        self._awaitBody = 0  # the body length of an upgrade request llhttp did not read
        self._continue = False
        self._refusal: Refusal | None = None
        # Parsing progress: callbacks made, and bytes fed since the last one.
        self._ticks = 0
        self._stale = 0
        self._done = 0  # messages completed
        # Complete requests waiting (with the bytes each holds), and the one answered.
        self._queue: deque[tuple[int, ServerRequest | Refusal]] = deque()
        self._current: ServerRequest | None = None
        self._ahead = 0
        self._serving = False
        self._answered = False
        self._stopped = False
        self._closed = False
        self._paused = False
        # The read deadline is kept as a time; one timer per connection checks it and is
        # rescheduled only when it fires early, so arming it costs an attribute store.
        self._deadline: float | None = None
        self._timer: IDelayedCall | None = None

    # -- connection life --------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._arm()

    def connectionLost(self, reason: Failure = _CLOSED) -> None:
        self._closed = self._stopped = True
        self._queue.clear()
        self._incoming = None
        self._parts = []
        self._deadline = None
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        request, self._current = self._current, None
        if request is not None and not request.finished:
            request.connectionLost(reason)

    def _arm(self) -> None:
        timeout = self.site.headerReadTimeout
        if timeout > 0:
            clock = self.site.clock
            self._deadline = clock.seconds() + timeout
            if self._timer is None:
                self._timer = clock.callLater(timeout, self._checkDeadline)

    def _checkDeadline(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return  # disarmed meanwhile; the next arming starts a timer again
        left = deadline - self.site.clock.seconds()
        if left > 0:
            self._timer = self.site.clock.callLater(left, self._checkDeadline)
            return
        self._deadline = None
        self.site.slowClients += 1
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # -- reading ----------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return  # after a refusal or a last request: read and dropped
        ticks = self._ticks
        fields = len(self._fields)
        # Whether this read starts in a head (or before one): then, while the head lasts,
        # all of it is head bytes.
        whole = self._inHead or not self._inMessage
        done = self._done
        self._feed(data)
        if self._inMessage and not self._stopped:
            self._limitPending(data, ticks != self._ticks or fields != len(self._fields),
                               whole and done == self._done)
        else:
            self._stale = 0
        self._serve()
        if self._current is None:
            if self._incoming is not None:
                self._arm()  # a body that keeps arriving is not idle
        elif not self._paused and self._held() > PIPELINE_HOLD:
            self._paused = True
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def _limitPending(self, data: bytes, progressed: bool, whole: bool) -> None:
        """Bound what llhttp and httptools hold of a head or chunk line not yet complete
        (they have no limit): the head's bytes when this read is all head, else the
        fields reported plus the bytes of reads that completed no field."""
        self._stale = 0 if progressed else self._stale + len(data)
        limit = self._maxHead
        if self._inHead:
            self._headRaw = self._headRaw + len(data) if whole else 0
            if max(self._headRaw, self._headSize() + self._stale) > limit or (
                len(self._fields) > MAX_HEADERS
            ):
                self._refused(Refusal(431, _HEAD_TOO_LARGE, pathOf(self._url)))
        elif self._stale > limit:
            self._refused(Refusal(400, "a chunk line is longer than the proxy accepts",
                                  pathOf(self._url)))

    def _feed(self, data: bytes) -> None:
        while data:
            try:
                self._parser.feed_data(data)
                return
            except HttpParserUpgrade as upgrade:
                data = self._notUpgraded(data[upgrade.args[0]:])
            except HttpParserError as error:
                if not self._stopped:  # else stopped on purpose from a callback
                    self._refused(self._refusalFor(error))
                return

    def _notUpgraded(self, rest: bytes) -> bytes:
        """llhttp stopped at an upgrade request: never upgrade, go on with a fresh parser
        (first framing the upgrade request's body, which llhttp skipped); the bytes to feed
        it."""
        self._parser = HttpRequestParser(self)
        length, self._awaitBody = self._awaitBody, 0
        if not length:
            return rest
        self._resuming = True
        framing = b"Transfer-Encoding: chunked" if length < 0 else b"Content-Length: %d" % length
        return b"POST / HTTP/1.1\r\n%s\r\n\r\n%s" % (framing, rest)

    def _refusalFor(self, error: HttpParserError) -> Refusal:
        if self._refusal is not None:
            return self._refusal
        if isinstance(error, HttpParserCallbackError):
            self.log.error("request-parse-crashed", problem=type(error.__context__).__name__)
            return Refusal(500, "internal proxy error")
        return Refusal(400, f"the request is not valid HTTP/1.1: {error}", pathOf(self._url))

    def _held(self) -> int:
        """Bytes of requests parsed ahead of the answer in progress."""
        return self._ahead + self._incomingBytes + (
            self._headBytes if self._inHead else 0) + self._stale

    def _fail(self, refusal: Refusal) -> NoReturn:
        self._refusal = refusal
        raise refusal

    # -- llhttp callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._ticks += 1
        self._inMessage = True
        self._headBytes = REQUEST_LINE
        if self._resuming:
            return
        self._inHead = True
        self._headRaw = 0
        self._url = b""
        self._fields = []
        self._fieldBytes = self._counted = 0
        self._trailerBytes = 0

    def on_url(self, url: bytes) -> None:
        self._ticks += 1
        self._url += url
        self._headBytes += len(url)
        if self._headBytes > self._maxHead:
            self._fail(Refusal(431, _HEAD_TOO_LARGE))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._inHead:
            self._fields.append((name, value))  # counted by ``_headSize``
            return
        self._ticks += 1
        self._trailerBytes += len(name) + len(value) + 4
        if self._trailerBytes > self._maxHead:
            self._fail(Refusal(431, "the request trailers are larger than the proxy accepts",
                               pathOf(self._url)))

    def _headSize(self) -> int:
        """The bytes of a partial head's reported parts (each field counted once)."""
        fields = self._fields
        counted = self._counted
        if len(fields) > counted:
            size = self._fieldBytes
            for name, value in fields[counted:]:
                size += len(name) + len(value) + 4
            self._fieldBytes = size
            self._counted = len(fields)
        return self._headBytes + self._fieldBytes

    def on_headers_complete(self) -> None:
        self._ticks += 1
        self._inHead = False
        if self._resuming:
            self._resuming = False
            self._upgrade = False
            self._trailerBytes = 0
            return
        fields = self._fields
        headers, size = headersOf(fields)
        self._headBytes += size
        if self._headBytes > self._maxHead or len(fields) > MAX_HEADERS:
            self._fail(Refusal(431, _HEAD_TOO_LARGE, pathOf(self._url)))
        parser = self._parser
        try:
            proto = clientProtocol(parser.get_http_version())
            method = parser.get_method()
            codings = headers.getRawHeaders(b"transfer-encoding")
            uri = checkHead(method, proto, self._url, headers, codings)
        except Refusal as refusal:
            if refusal.path == b"/":
                refusal.path = pathOf(self._url)
            self._fail(refusal)
        self._fields = []
        request = ServerRequest(self, method, uri, proto, headers,
                                proto == HTTP11 and parser.should_keep_alive())
        self._incoming = request
        self._incomingBytes = self._headBytes
        self._parts = []
        self._received = 0
        self._upgrade = parser.should_upgrade()
        length = _announced(headers)
        self._bodyLength = -1 if codings is not None else length
        if not self._bodyLength:
            return
        if length > self.site.maxBody:
            request.tooLarge = True
        expect = headers.getRawHeaders(b"expect")
        if proto == HTTP11 and expect is not None and expect[-1].lower() == b"100-continue":
            if request.tooLarge:
                # Answered at once, before the body is sent, and closed: the client
                # never sends it.
                request.persistent = False
                self._complete()
                self._stopped = True
                raise _Stop()
            self._continue = True

    def on_body(self, body: bytes) -> None:
        self._ticks += 1
        self._incomingBytes += len(body)
        request = self._incoming
        if request is None or request.tooLarge:
            return
        self._received += len(body)
        if self._received > self.site.maxBody:
            request.tooLarge = True
            self._parts = []
            return
        self._parts.append(body)

    def on_chunk_header(self) -> None:
        self._ticks += 1

    def on_chunk_complete(self) -> None:
        self._ticks += 1

    def on_message_complete(self) -> None:
        self._ticks += 1
        self._done += 1
        if self._upgrade and self._bodyLength:
            # llhttp skips the body of an upgrade request; ``_notUpgraded`` reads it.
            self._awaitBody = self._bodyLength
            return
        self._inMessage = False
        request = self._complete()
        if not request.persistent:
            self._stopped = True
            raise _Stop()

    def _complete(self) -> ServerRequest:
        request = self._incoming
        assert request is not None
        self._incoming = None
        self._continue = False
        parts, self._parts = self._parts, []
        if parts and not request.tooLarge:
            request.content = io.BytesIO(parts[0] if len(parts) == 1 else b"".join(parts))
        size = self._incomingBytes + QUEUED
        self._incomingBytes = 0
        self._ahead += size
        self._queue.append((size, request))
        return request

    def _refused(self, refusal: Refusal) -> None:
        """Stop reading; the error answer follows the answers queued before it."""
        self._stopped = True
        self._inMessage = self._inHead = False
        self._incoming = None
        self._parts = []
        self._queue.append((0, refusal))

    # -- answering --------------------------------------------------------------------------

    def _serve(self) -> None:
        """Hand queued requests to the door while none is being answered."""
        if self._serving or self._closed:
            return
        self._serving = True
        try:
            while self._current is None and self._queue:
                size, item = self._queue.popleft()
                self._ahead -= size
                self._dispatch(item)
        finally:
            self._serving = False
        if self._current is None and not self._closed:
            if self._answered:
                self._answered = False
                self._arm()
            if self._continue:
                self._continue = False
                self.send(_CONTINUE)
        if self._paused and (self._current is None or self._held() <= PIPELINE_HOLD):
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]

    def _dispatch(self, item: ServerRequest | Refusal) -> None:
        self._deadline = None
        if isinstance(item, Refusal):
            request = self._current = ServerRequest(
                self, b"GET", item.path, HTTP11, Headers(), False)
            self.site.refuse(request, item.status, item.message)
            return
        self._current = item
        door = self.site.door
        try:
            door.handle(item)
        except Exception as e:
            door.crashed(item, e)

    def send(self, data: bytes) -> None:
        """Write answer bytes to the client (nothing once the connection is gone)."""
        transport = self.transport
        if transport is not None:
            sendNow(transport, data)

    def requestDone(self, request: ServerRequest) -> None:
        """The answer to ``request`` is complete: serve the next request, or close."""
        if request is not self._current:
            return
        self._current = None
        if not request.persistent:
            self._stopped = True
            self._queue.clear()
            self._incoming = None
            if self.transport is not None:
                self.transport.loseConnection()
            return
        self._answered = True
        self._serve()


def _announced(headers: Headers) -> int:
    """The Content-Length llhttp accepted (digits only), or 0."""
    values = headers.getRawHeaders(b"content-length")
    return int(values[0]) if values else 0
