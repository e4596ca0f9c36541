"""The server side of a facade connection: HTTP/1.1 request framing at byte level.

``ServerChannel`` is one client connection.  It finds a request head with one search for
its blank line, splits it once, reads a Content-Length or chunked body up to the site's
``maxBody`` (beyond it the body is read and dropped in constant memory and the request is
flagged ``tooLarge``), and hands each complete request to the site's door.  Requests on a
kept-alive connection are answered in order; bytes of a pipelined next request wait, and
reading pauses once they pass ``PIPELINE_HOLD``.

Limits: a head over ``maxHeaderBytes`` or with more than ``MAX_HEADERS`` lines is answered
431; malformed framing 400; both close the connection.  A client must send a whole head
within ``headerReadTimeout`` of connecting or of its previous answer, and must not leave
a body idle for that long; otherwise it is cut.  No deadline runs while a request is being
answered (a long stream is the engine's time, not the client's).
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.proxy.fastwrite import sendNow
from nvpair.proxy.httpframing import headerKey
from nvpair.proxy.serverrequest import HTTP11, ServerRequest

if TYPE_CHECKING:
    from nvpair.proxy.site import FacadeSite

def _learnName(name: bytes) -> bytes | None:
    """A valid header name's ``Headers`` key, remembered (up to ``MAX_NAMES`` names);
    ``None`` for a name that is not an HTTP token."""
    try:
        key = headerKey(name)
    except ValueError:
        return None
    if len(_KEYS) < MAX_NAMES:
        _KEYS[name] = key
    return key


# Header names as sent by clients, and their key in ``Headers``; only valid names enter.
_KEYS: dict[bytes, bytes] = {}
MAX_NAMES = 1024
_METHODS = frozenset((b"GET", b"POST", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"PATCH"))
_CLOSED = Failure(ConnectionDone())
MAX_HEADERS = 500
MAX_CHUNK_LINE = 4096
PIPELINE_HOLD = 1 << 16
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_TARGET = re.compile(rb"[\x21-\x7e\x80-\xff]+\Z")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}\Z")
_VERSIONS = (HTTP11, b"HTTP/1.0")
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TOO_LARGE_HEAD = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# Connection states: reading a head, a body of known length, a chunked body; answering.
HEAD, BODY, CHUNKED, ANSWERING, CLOSED = range(5)
# Chunked-body states.
SIZE, DATA, DATA_END, TRAILER = range(4)


class BadRequest(Exception):
    """The client sent something that is not HTTP/1.1 framing we accept."""


class ServerChannel(Protocol):
    """One facade client connection: parses requests and serves them one at a time."""

    log = Logger()

    def __init__(self, site: FacadeSite) -> None:
        self.site = site
        self._buffer = b""
        self._state = HEAD
        self._consuming = False
        self._request: ServerRequest | None = None
        self._bodyLeft = 0
        self._bodyParts: list[bytes] = []
        self._received = 0
        self._chunkState = SIZE
        self._trailerBytes = 0
        self._scanned = 0  # bytes of a partial head already searched for its end
        self._paused = False
        # The read deadline is kept as a time; one timer per connection checks it and is
        # rescheduled only when it fires early, so arming it costs an attribute store.
        self._deadline: float | None = None
        self._timer: IDelayedCall | None = None

    # -- connection life --------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._arm()

    def connectionLost(self, reason: Failure = _CLOSED) -> None:
        self._state = CLOSED
        self._buffer = b""
        self._bodyParts = []
        self._deadline = None
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        request, self._request = self._request, None
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
        self._buffer = self._buffer + data if self._buffer else data
        state = self._state
        if state >= ANSWERING:
            if state == ANSWERING and not self._paused and len(self._buffer) > PIPELINE_HOLD:
                self._paused = True
                self.transport.pauseProducing()  # type: ignore[union-attr]
            return
        if state != HEAD and self._deadline is not None:
            self._arm()  # a body that keeps arriving is not idle
        if not self._consuming:
            self._consume()

    def _consume(self) -> None:
        self._consuming = True
        try:
            while self._buffer and self._state < ANSWERING:
                state = self._state
                if state == HEAD:
                    more = self._readHead()
                elif state == BODY:
                    more = self._readBody()
                else:
                    more = self._readChunked()
                if not more:
                    break
        except BadRequest:
            self._refuse(_BAD_REQUEST)
        finally:
            self._consuming = False

    def _readHead(self) -> bool:
        buf = self._buffer
        if buf[:2] == b"\r\n":
            buf = self._buffer = buf.lstrip(b"\r\n")  # stray line ends between requests
            self._scanned = 0
            if not buf:
                return False
        # Only the bytes that arrived since the last look are searched (and the three
        # before them, for an end split across reads): a head sent a byte at a time costs
        # one pass, not one per byte.
        end = buf.find(b"\r\n\r\n", max(self._scanned - 3, 0))
        limit = self.site.maxHeaderBytes
        if end < 0:
            self._scanned = len(buf)
            if len(buf) > limit:
                self._refuse(_TOO_LARGE_HEAD)
            return False
        self._scanned = 0
        if end > limit:
            self._refuse(_TOO_LARGE_HEAD)
            return False
        head = buf[:end]
        self._buffer = buf[end + 4:]
        self._startRequest(head)
        return True

    def _startRequest(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        crlfs = len(lines) - 1
        if head.count(b"\n") != crlfs or head.count(b"\r") != crlfs or b"\x00" in head:
            raise BadRequest()
        if crlfs > MAX_HEADERS:
            self._refuse(_TOO_LARGE_HEAD)
            return
        parts = lines[0].split(b" ")
        if len(parts) != 3:
            raise BadRequest()
        method, uri, version = parts
        if version not in _VERSIONS or not (method in _METHODS or _TOKEN.match(method)) or (
            not _TARGET.match(uri)
        ):
            raise BadRequest()
        headers = Headers()
        raw = headers._rawHeaders
        keys = _KEYS
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            key = keys.get(name)
            if key is None or not sep:
                key = _learnName(name) if sep else None
                if key is None:
                    raise BadRequest()
            value = value.strip(b" \t")
            values = raw.get(key)
            if values is None:
                raw[key] = [value]
            else:
                values.append(value)
        persistent = version == HTTP11
        connection = raw.get(b"Connection")
        if persistent and connection is not None:
            for value in connection:
                if b"close" in [t.strip() for t in value.lower().split(b",")]:
                    persistent = False
        request = self._request = ServerRequest(self, method, uri, version, headers, persistent)
        self._frameBody(request, raw)

    def _frameBody(self, request: ServerRequest, raw: dict[bytes, list[bytes]]) -> None:
        coding = raw.get(b"Transfer-Encoding")
        length = raw.get(b"Content-Length")
        self._bodyParts = []
        self._received = 0
        if coding is not None:
            if length is not None or len(coding) != 1 or coding[0].lower() != b"chunked":
                raise BadRequest()
            self._state = CHUNKED
            self._chunkState = SIZE
            self._trailerBytes = 0
        elif length is not None:
            first = length[0]
            if not (first.isdigit() and len(first) <= 18) or any(v != first for v in length):
                raise BadRequest()
            size = int(first)
            if size == 0:
                self._dispatch()
                return
            self._bodyLeft = size
            self._state = BODY
            if size > self.site.maxBody:
                request.tooLarge = True
            if len(self._buffer) >= size:
                return  # the whole body is here already: no idle time to watch
        else:
            self._dispatch()
            return
        expect = raw.get(b"Expect")
        if expect is not None and request.clientproto == HTTP11 and (
            expect[-1].lower() == b"100-continue"
        ):
            if request.tooLarge:
                # Answer before the body is sent, and close: the client never sends it.
                request.persistent = False
                self._dispatch()
                return
            sendNow(self.transport, _CONTINUE)
        if self._deadline is not None:
            self._arm()  # from now on the deadline is the body's idle time

    def _take(self, data: bytes) -> None:
        """Keep body bytes up to ``maxBody``; past it, count them only."""
        request = self._request
        assert request is not None
        if request.tooLarge:
            return
        self._received += len(data)
        if self._received > self.site.maxBody:
            request.tooLarge = True
            self._bodyParts = []
            return
        self._bodyParts.append(data)

    def _readBody(self) -> bool:
        buf = self._buffer
        left = self._bodyLeft
        if len(buf) < left:
            self._take(buf)
            self._bodyLeft = left - len(buf)
            self._buffer = b""
            return False
        self._take(buf[:left] if len(buf) > left else buf)
        self._buffer = buf[left:] if len(buf) > left else b""
        self._bodyLeft = 0
        self._dispatch()
        return True

    def _readChunked(self) -> bool:
        """Decode what the buffer holds of a chunked body, walking it by index (a read of
        many small chunks costs one pass, not one copy of the rest per chunk)."""
        buf = self._buffer
        at = 0
        size = len(buf)
        while at < size:
            if self._chunkState == DATA:
                piece = buf[at:at + self._bodyLeft]
                self._take(piece)
                at += len(piece)
                self._bodyLeft -= len(piece)
                if not self._bodyLeft:
                    self._chunkState = DATA_END
                continue
            end = buf.find(b"\r\n", at)
            if end < 0:
                if size - at > MAX_CHUNK_LINE:
                    raise BadRequest()
                break
            line = buf[at:end]
            at = end + 2
            state = self._chunkState
            if state == SIZE:
                digits = line.split(b";", 1)[0].strip(b" \t")
                if not _HEX.match(digits):
                    raise BadRequest()
                self._bodyLeft = int(digits, 16)
                self._chunkState = DATA if self._bodyLeft else TRAILER
            elif state == DATA_END:
                if line:
                    raise BadRequest()
                self._chunkState = SIZE
            elif line:
                self._trailerBytes += len(line) + 2
                if self._trailerBytes > self.site.maxHeaderBytes:
                    self._refuse(_TOO_LARGE_HEAD)
                    return False
            else:
                self._buffer = buf[at:]
                self._dispatch()
                return True
        self._buffer = buf[at:] if at else buf
        return False

    # -- answering --------------------------------------------------------------------------

    def _dispatch(self) -> None:
        request = self._request
        assert request is not None
        self._state = ANSWERING
        self._deadline = None
        parts, self._bodyParts = self._bodyParts, []
        if parts and not request.tooLarge:
            request.content = io.BytesIO(parts[0] if len(parts) == 1 else b"".join(parts))
        door = self.site.door
        try:
            door.handle(request)
        except Exception as e:
            door.crashed(request, e)

    def requestDone(self, request: ServerRequest) -> None:
        """The answer to ``request`` is complete: read the next request, or close."""
        if request is not self._request or self._state != ANSWERING:
            return
        self._request = None
        if not request.persistent:
            self._state = CLOSED
            self._buffer = b""
            if self.transport is not None:
                self.transport.loseConnection()
            return
        self._state = HEAD
        self._arm()
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]
        if self._buffer and not self._consuming:
            self._consume()

    def _refuse(self, answer: bytes) -> None:
        """Answer a framing error and close the connection."""
        self._state = CLOSED
        self._buffer = b""
        self._deadline = None
        transport = self.transport
        if transport is not None:
            transport.write(answer)
            transport.loseConnection()
        request, self._request = self._request, None
        if request is not None and not request.finished:
            request.connectionLost(_CLOSED)
