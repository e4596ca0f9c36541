"""Reading requests off a facade connection: llhttp framing, limits, bodies.

``RequestReader`` feeds a connection's bytes to an ``httptools`` ``HttpRequestParser``
(llhttp, strict: no leniency is switched on).  Its callbacks gather each head, apply
``rules``, keep the body up to ``maxBody`` (beyond it the body is read and dropped
in constant memory and the request is flagged ``tooLarge``) and hand each complete request
to the channel's queue.  llhttp has no limits of its own, so the callbacks count: a head
over ``maxHeaderBytes`` or with more than ``MAX_HEADERS`` fields is refused 431, and so is a
run of that many bytes that completes no field (a header line without end; 400 inside a
chunked body).  Anything llhttp or the rules refuse becomes a ``Refusal`` in the queue.
After a refusal, or a request that ends its connection (``Connection: close``, HTTP/1.0),
the reader stops: nothing more is parsed.  Upgrade requests are never upgraded: llhttp
stops at one, and reading goes on with a fresh parser (the body it skipped included).
"""

from __future__ import annotations

import io
from enum import Enum
from typing import NoReturn

from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
)
from twisted.logger import Logger
from twisted.web.http_headers import Headers

from nvpair.proxy.http.interfaces import IServerChannel, ISite
from nvpair.proxy.http.refusal import Refusal
from nvpair.proxy.http.request import HTTP11, ServerRequest
from nvpair.proxy.http.rules import checkHead, clientProtocol, headersOf, pathOf

MAX_HEADERS = 500
REQUEST_LINE = 16  # the method, version, spaces and line ends around the target
QUEUED = 256  # what a queued request costs beyond its bytes
_HEAD_TOO_LARGE = "the request head is larger than the proxy accepts"


class _Stop(Exception):
    """Raised from a callback to stop llhttp: nothing after this point is parsed."""


class Reading(Enum):
    """Where the reader is in the connection's bytes."""

    BETWEEN = "between"  # before a message (or between two)
    HEAD = "head"  # in a request's head
    RESUMING = "resuming"  # in the head framing an upgrade request's body (``_notUpgraded``)
    BODY = "body"  # past a head: in its body, or awaiting the rest of it
    STOPPED = "stopped"  # nothing more is parsed: the connection ends


BETWEEN = Reading.BETWEEN
HEAD = Reading.HEAD
RESUMING = Reading.RESUMING
BODY = Reading.BODY
STOPPED = Reading.STOPPED


class RequestReader:
    """Parses one connection's requests and queues each on its channel."""

    log = Logger()

    def __init__(self, channel: IServerChannel, site: ISite) -> None:
        self.channel = channel
        self._site = site  # its limits are read anew for each request
        self._maxHead = site.maxHeaderBytes
        self._maxBody = site.maxBody
        self._parser = HttpRequestParser(self)
        self.reading = BETWEEN
        # The message being parsed: its head, then its body.
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._headBytes = 0  # the request line and target as reported so far
        self._fieldBytes = 0  # the first ``_counted`` fields of a head still arriving
        self._counted = 0
        self._headRaw = 0  # the head's bytes read so far, when known
        self._trailerBytes = 0
        self.incoming: ServerRequest | None = None  # head read, body arriving
        self._incomingBytes = 0
        self._parts: list[bytes] = []
        self._received = 0
        self._upgrade = False
        self._bodyLength = 0  # announced: -1 for chunked
        self._awaitBody = 0  # the body length of an upgrade request llhttp did not read
        self.wantsContinue = False  # ``incoming`` announced ``Expect: 100-continue``
        self._refusal: Refusal | None = None
        # Parsing progress: callbacks made, and bytes fed since the last one.
        self._ticks = 0
        self._stale = 0
        self._done = 0  # messages completed

    def stop(self) -> None:
        """Parse nothing more (the connection ends)."""
        self.reading = STOPPED
        self.incoming = None
        self.wantsContinue = False
        self._parts = []

    def pending(self) -> int:
        """Bytes of the request being read (not yet queued)."""
        return self._incomingBytes + (self._headBytes if self.reading is HEAD else 0) + self._stale

    def feed(self, data: bytes) -> None:
        """Parse ``data``: complete requests, and any refusal, go to the channel's queue."""
        ticks = self._ticks
        fields = len(self._fields)
        # Whether this read starts in a head (or before one): then, while the head lasts,
        # all of it is head bytes.
        reading = self.reading
        whole = reading is HEAD or reading is BETWEEN
        done = self._done
        self._feed(data)
        reading = self.reading
        if reading is not BETWEEN and reading is not STOPPED:
            self._limitPending(
                data,
                ticks != self._ticks or fields != len(self._fields),
                whole and done == self._done,
            )
        else:
            self._stale = 0

    def _limitPending(self, data: bytes, progressed: bool, whole: bool) -> None:
        """Bound what llhttp and httptools hold of a head or chunk line not yet complete
        (they have no limit): the head's bytes when this read is all head, else the
        fields reported plus the bytes of reads that completed no field."""
        self._stale = 0 if progressed else self._stale + len(data)
        limit = self._maxHead
        if self.reading is HEAD:
            self._headRaw = self._headRaw + len(data) if whole else 0
            if max(self._headRaw, self._headSize() + self._stale) > limit or (
                len(self._fields) > MAX_HEADERS
            ):
                self._refused(Refusal(431, _HEAD_TOO_LARGE, pathOf(self._url)))
        elif self._stale > limit:
            self._refused(
                Refusal(400, "a chunk line is longer than the proxy accepts", pathOf(self._url))
            )

    def _feed(self, data: bytes) -> None:
        while data:
            try:
                self._parser.feed_data(data)
                return
            except HttpParserUpgrade as upgrade:
                data = self._notUpgraded(data[upgrade.args[0] :])
            except HttpParserError as error:
                if self.reading is not STOPPED:  # else stopped on purpose from a callback
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
        self.reading = RESUMING
        framing = b"Transfer-Encoding: chunked" if length < 0 else b"Content-Length: %d" % length
        return b"POST / HTTP/1.1\r\n%s\r\n\r\n%s" % (framing, rest)

    def _refusalFor(self, error: HttpParserError) -> Refusal:
        if self._refusal is not None:
            return self._refusal
        if isinstance(error, HttpParserCallbackError):
            self.log.error("request-parse-crashed", problem=type(error.__context__).__name__)
            return Refusal(500, "internal proxy error", pathOf(self._url))
        return Refusal(400, f"the request is not valid HTTP/1.1: {error}", pathOf(self._url))

    def _fail(self, refusal: Refusal) -> NoReturn:
        self._refusal = refusal
        raise refusal

    # -- llhttp callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._ticks += 1
        self._headBytes = REQUEST_LINE
        if self.reading is RESUMING:
            return
        self._maxHead = self._site.maxHeaderBytes
        self._maxBody = self._site.maxBody
        self.reading = HEAD
        self._headRaw = 0
        self._url = b""
        self._fields = []
        self._fieldBytes = self._counted = 0
        self._trailerBytes = 0

    def on_url(self, url: bytes) -> None:
        self._ticks += 1
        if self.reading is RESUMING:
            return
        self._url += url
        self._headBytes += len(url)
        if self._headBytes > self._maxHead:
            self._fail(Refusal(431, _HEAD_TOO_LARGE, pathOf(self._url)))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.reading is HEAD:
            self._fields.append((name, value))  # counted by ``_headSize``
            return
        self._ticks += 1
        self._trailerBytes += len(name) + len(value) + 4
        if self._trailerBytes > self._maxHead:
            self._fail(
                Refusal(
                    431, "the request trailers are larger than the proxy accepts", pathOf(self._url)
                )
            )

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
        resuming = self.reading is RESUMING
        self.reading = BODY
        if resuming:
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
        request = ServerRequest(
            self.channel,
            method,
            uri,
            proto,
            headers,
            proto == HTTP11 and parser.should_keep_alive(),
        )
        self.incoming = request
        self._incomingBytes = self._headBytes
        self._parts = []
        self._received = 0
        self._upgrade = parser.should_upgrade()
        length = _announced(headers)
        self._bodyLength = -1 if codings is not None else length
        if not self._bodyLength:
            return
        if length > self._maxBody:
            request.tooLarge = True
        expect = headers.getRawHeaders(b"expect")
        if proto == HTTP11 and expect is not None and expect[-1].lower() == b"100-continue":
            if request.tooLarge:
                # Answered at once, before the body is sent, and closed: the client
                # never sends it.
                request.persistent = False
                self._complete()
                self.reading = STOPPED
                raise _Stop()
            self.wantsContinue = True

    def on_body(self, body: bytes) -> None:
        self._ticks += 1
        self._incomingBytes += len(body)
        request = self.incoming
        if request is None or request.tooLarge:
            return
        self._received += len(body)
        if self._received > self._maxBody:
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
        self.reading = BETWEEN
        request = self._complete()
        if not request.persistent:
            self.reading = STOPPED
            raise _Stop()

    def _complete(self) -> ServerRequest:
        request = self.incoming
        assert request is not None
        self.incoming = None
        self.wantsContinue = False
        parts, self._parts = self._parts, []
        if parts and not request.tooLarge:
            request.content = io.BytesIO(parts[0] if len(parts) == 1 else b"".join(parts))
        self.channel.queue(self._incomingBytes + QUEUED, request)
        self._incomingBytes = 0
        return request

    def _refused(self, refusal: Refusal) -> None:
        """Stop reading; the error answer follows the answers queued before it."""
        self.stop()
        self.channel.queue(0, refusal)


def _announced(headers: Headers) -> int:
    """The Content-Length llhttp accepted (digits only), or 0."""
    values = headers.getRawHeaders(b"content-length")
    return int(values[0]) if values else 0
