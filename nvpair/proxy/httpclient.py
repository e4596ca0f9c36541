"""A lean HTTP/1.1 client for the request path: one write per request, byte-level parsing.

``httppool.ConnectionPool.request`` sends one serialized request over a pooled keep-alive
connection (or a new one from an endpoint) and fires with a ``Response`` that has the
``IResponse`` surface the proxy uses (``code``, ``phrase``, ``headers``, ``length``,
``deliverBody``).  The body protocol's transport pauses, resumes and stops the upstream
read.  Bodies are Content-Length, chunked or close-delimited; the chunk payloads of one
socket read reach the body protocol as one ``dataReceived``.  Clean ends are
``ResponseDone`` (``PotentialDataLoss`` for a close-delimited body), anything else is
``ResponseFailed`` -- the same reasons twisted.web's Agent gives.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss, _DataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

from nvpair.proxy.fastwrite import sendNow

if TYPE_CHECKING:
    from nvpair.proxy.httppool import ConnectionPool

_DONE = Failure(ResponseDone())
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")
_BLANKS = b" \t"
MAX_HEAD = 1 << 18  # response status line + headers
MAX_LINE = 1 << 12  # one chunk-size or trailer line
NO_BODY_CODES = (204, 304)
# Connection-control headers: framing, not part of ``Response.headers`` (as in twisted.web).
_CONNECTION_CONTROL = frozenset((
    b"content-length", b"connection", b"keep-alive", b"te", b"trailers",
    b"transfer-encoding", b"upgrade", b"proxy-connection",
))

# Connection states.
IDLE, WAITING, BODY, DEAD = range(4)
# Body framings and chunked-decoder states.
LENGTH, CHUNKED, CLOSE = range(3)
SIZE, DATA, CRLF, TRAILER = range(4)


class BadResponse(Exception):
    """The upstream sent something that is not HTTP/1.1 framing we can follow."""


def serializeRequest(
    method: bytes, target: bytes, host: bytes, headers: Headers, body: bytes | None
) -> bytes:
    """The request head (and body) as the bytes to write; ``body=None`` sends no length."""
    parts = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, target, host)]
    for name, values in headers.getAllRawHeaders():
        for value in values:
            parts.append(b"%s: %s\r\n" % (name, value))
    if body is None:
        parts.append(b"\r\n")
    else:
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        parts.append(body)
    return b"".join(parts)


class _BodyTransport:
    """The body protocol's transport: flow control of one response, inert once it ended."""

    __slots__ = ("_conn",)

    def __init__(self, conn: HTTPClientConnection) -> None:
        self._conn: HTTPClientConnection | None = conn

    def pauseProducing(self) -> None:
        if self._conn is not None:
            self._conn.pauseBody(True)

    def resumeProducing(self) -> None:
        if self._conn is not None:
            self._conn.pauseBody(False)

    def stopProducing(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.stopBody()


class Response:
    """One upstream response: status, headers, length, and its body on ``deliverBody``."""

    version = (b"HTTP", 1, 1)
    request = None

    __slots__ = (
        "code", "phrase", "headers", "length", "previousResponse", "_conn", "transport",
        "_protocol", "_buffer", "_ended",
    )

    def __init__(
        self, conn: HTTPClientConnection, code: int, phrase: bytes, headers: Headers,
        length: Any,
    ) -> None:
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.length = length
        self.previousResponse: Any = None
        self._conn = conn
        self.transport = _BodyTransport(conn)
        self._protocol: Any = None
        self._buffer: list[bytes] | None = None  # body bytes before deliverBody, if any
        self._ended: Failure | None = None

    def setPreviousResponse(self, response: Any) -> None:
        self.previousResponse = response

    def deliverBody(self, protocol: Any) -> None:
        """Connect ``protocol`` to the body: buffered bytes first, then the rest as it comes."""
        if self._protocol is not None:
            raise RuntimeError("the body was already delivered")
        self._protocol = protocol
        protocol.makeConnection(self.transport)
        buffered, self._buffer = self._buffer or (), None
        for data in buffered:
            if self.transport._conn is None and self._ended is None:
                break
            protocol.dataReceived(data)
        if self._ended is not None:
            protocol.connectionLost(self._ended)
        elif self.transport._conn is not None:
            self.transport._conn.holdBody(False)

    def bodyData(self, data: bytes) -> None:
        """Bytes of the body (from the connection)."""
        if self._protocol is not None:
            self._protocol.dataReceived(data)
        else:
            if self._buffer is None:
                self._buffer = []
            self._buffer.append(data)
            self._conn.holdBody(True)

    def bodyEnded(self, reason: Failure) -> None:
        """The body ended with ``reason`` (from the connection); the transport goes inert."""
        self.transport._conn = None
        if self._protocol is not None:
            self._protocol.connectionLost(reason)
        else:
            self._ended = reason


class HTTPClientConnection(Protocol):
    """One keep-alive connection to an upstream: one request at a time."""

    def __init__(self, pool: ConnectionPool, key: Any) -> None:
        self._pool = pool
        self.key = key
        self.state = IDLE
        self.idleSince = 0.0
        self._d: defer.Deferred[Response] | None = None
        self._method = b""
        self._buf = b""
        self._response: Response | None = None
        self._mode = CLOSE
        self._remaining = 0
        self._chunkState = SIZE
        self._reusable = False
        self._stopped = False
        self._pausedByBody = False
        self._held = False
        self._closed: list[defer.Deferred[None]] = []
        self._lost = False
        # A direct dial (``httppool.DirectTCP``) fires this with the connection once made.
        self.whenMade: defer.Deferred[HTTPClientConnection] | None = None

    def connectionMade(self) -> None:
        setNoDelay = getattr(self.transport, "setTcpNoDelay", None)
        if setNoDelay is not None:
            try:
                setNoDelay(True)
            except OSError:
                pass
        made, self.whenMade = self.whenMade, None
        if made is not None and not made.called:
            made.callback(self)

    # -- sending --------------------------------------------------------------------------

    def send(self, data: bytes, method: bytes, d: defer.Deferred[Response]) -> None:
        """Write one request; ``d`` fires with its response (or fails)."""
        self.state = WAITING
        self._d = d
        self._method = method
        self._buf = b""
        self._stopped = False
        sendNow(self.transport, data)

    def abort(self) -> None:
        """Drop the connection at once (a cancelled request)."""
        self._d = None
        self._reusable = False
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # -- receiving ------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state == BODY:
            self._bodyReceived(data)
        elif state == WAITING:
            self._headReceived(data)
        elif state == IDLE:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted

    def _headReceived(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0 and b"\n\n" not in buf[:end]:
                head, buf = buf[:end], buf[end + 4:]
            else:
                match = _HEAD_END.search(buf)  # bare LF line ends
                if match is None:
                    if len(buf) > MAX_HEAD:
                        self._protocolError("response head too large")
                        return
                    self._buf = buf
                    return
                head, buf = buf[: match.start()], buf[match.end():]
            try:
                response = self._parseHead(head)
            except (BadResponse, ValueError):
                self._protocolError("malformed response head")
                return
            if response is not None:
                break  # otherwise an interim 1xx answer: parse the next head
        self._buf = b""
        self._response = response
        self.state = BODY
        d, self._d = self._d, None
        if response.length == 0 and self._mode != CLOSE:
            self._finish(buf)
            if d is not None:
                d.callback(response)
            return
        if d is not None:
            d.callback(response)
        if buf and self.state == BODY and not self._stopped:
            self._bodyReceived(buf)

    def _parseHead(self, head: bytes) -> Response | None:
        lines = head.splitlines()
        status = lines[0].split(b" ", 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/") or len(status[1]) != 3:
            raise BadResponse("bad status line")
        code = int(status[1])
        if 100 <= code < 200:
            return None
        phrase = status[2] if len(status) == 3 else b""
        headers = Headers()
        raw = headers._rawHeaders
        names = _NAMES
        control: dict[bytes, list[bytes]] = {}
        isHead = self._method == b"HEAD"
        last: list[bytes] | None = None
        for line in lines[1:]:
            if line[:1] in (b" ", b"\t"):
                if last is None:
                    raise BadResponse("continuation before a header")
                last[-1] = last[-1] + b" " + line.strip()
                continue
            name, sep, value = line.partition(b":")
            if not sep or not name or name[-1] in _BLANKS:
                raise BadResponse("bad header line")
            value = value.strip()
            lower = name.lower()
            if lower in _CONNECTION_CONTROL:
                control.setdefault(lower, []).append(value)
                if not (isHead and lower == b"content-length"):
                    last = None
                    continue
            key = names.get(name) or _canonicalName(name)
            last = raw.get(key)
            if last is None:
                last = raw[key] = [value]
            else:
                last.append(value)
        version = status[0]
        tokens = b",".join(control.get(b"connection", ())).lower()
        self._reusable = version == b"HTTP/1.1" and b"close" not in tokens
        length: Any = UNKNOWN_LENGTH
        if isHead or code in NO_BODY_CODES:
            length, self._mode = 0, LENGTH
        elif b"transfer-encoding" in control:
            if control[b"transfer-encoding"][-1].lower().rsplit(b",", 1)[-1].strip() != b"chunked":
                raise BadResponse("unknown transfer coding")
            self._mode, self._chunkState = CHUNKED, SIZE
        elif b"content-length" in control:
            values = {int(v) for v in b",".join(control[b"content-length"]).split(b",")}
            if len(values) != 1 or min(values) < 0:
                raise BadResponse("bad content-length")
            length = self._remaining = values.pop()
            self._mode = LENGTH
        else:
            self._mode = CLOSE
            self._reusable = False
        return Response(self, code, phrase, headers, length)

    def _bodyReceived(self, data: bytes) -> None:
        response = self._response
        assert response is not None
        mode = self._mode
        if mode == CHUNKED:
            self._chunksReceived(data)
        elif mode == LENGTH:
            left = self._remaining
            if len(data) < left:
                self._remaining = left - len(data)
                response.bodyData(data)
                return
            self._remaining = 0
            if left:
                response.bodyData(data[:left] if len(data) > left else data)
            if self.state == BODY and not self._stopped:
                self._finish(data[left:])
        else:
            response.bodyData(data)

    def _chunksReceived(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        size = len(buf)
        pos = 0
        parts: list[bytes] = []
        state = self._chunkState
        remaining = self._remaining
        hexMatch = _HEX.fullmatch
        done = False
        while pos < size:
            if state == DATA:
                end = pos + remaining
                if end > size:
                    parts.append(buf[pos:])
                    remaining = end - size
                    pos = size
                    break
                parts.append(buf[pos:end])
                pos, remaining = end, 0
                if buf[pos:pos + 2] == b"\r\n":  # the usual case: CRLF right behind
                    pos += 2
                    state = SIZE
                else:
                    state = CRLF
                continue
            eol = buf.find(b"\n", pos)
            if eol < 0:
                if size - pos > MAX_LINE:
                    self._protocolError("chunk line too long")
                    return
                break
            line = buf[pos:eol - 1] if eol > pos and buf[eol - 1] == 13 else buf[pos:eol]
            pos = eol + 1
            if state == SIZE:
                if hexMatch(line) is None:
                    line = line.split(b";", 1)[0].strip()
                    if hexMatch(line) is None:
                        self._protocolError("bad chunk size")
                        return
                remaining = int(line, 16)
                state = DATA if remaining else TRAILER
            elif state == CRLF:
                if line:
                    self._protocolError("chunk not followed by CRLF")
                    return
                state = SIZE
            elif not line:  # TRAILER: the empty line ends the body
                done = True
                break
        self._chunkState = state
        self._remaining = remaining
        self._buf = b"" if done or pos >= size else buf[pos:]
        if parts:
            assert self._response is not None
            self._response.bodyData(parts[0] if len(parts) == 1 else b"".join(parts))
        if done and self.state == BODY and not self._stopped:
            self._finish(buf[pos:])

    def _finish(self, rest: bytes) -> None:
        """The body ended cleanly: back to the pool (or closed), then tell the response."""
        response, self._response = self._response, None
        self._buf = b""
        if self._reusable and not rest and not self._stopped:
            self.state = IDLE
            if self._pausedByBody or self._held:
                self._pausedByBody = self._held = False
                assert self.transport is not None
                self.transport.resumeProducing()  # type: ignore[attr-defined]
            self._pool.release(self)
        else:
            self.state = DEAD
            if self.transport is not None:
                self.transport.loseConnection()
        if response is not None:
            response.bodyEnded(_DONE)

    def _protocolError(self, problem: str) -> None:
        self._reusable = False
        error = Failure(BadResponse(problem))
        d, self._d = self._d, None
        response, self._response = self._response, None
        self.state = DEAD
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]
        if d is not None:
            d.errback(ResponseFailed([error]))
        if response is not None:
            response.bodyEnded(Failure(ResponseFailed([error])))

    # -- flow control of the body ---------------------------------------------------------

    def pauseBody(self, paused: bool) -> None:
        """The body protocol pauses or resumes the read."""
        self._pausedByBody = paused
        self._applyPause()

    def holdBody(self, held: bool) -> None:
        """Hold the read while no body protocol is connected yet."""
        self._held = held
        self._applyPause()

    def _applyPause(self) -> None:
        transport: Any = self.transport
        if transport is None or self.state != BODY:
            return
        if self._pausedByBody or self._held:
            transport.pauseProducing()
        else:
            transport.resumeProducing()

    def stopBody(self) -> None:
        """The body protocol does not want the rest: the connection is dropped."""
        if self.state != BODY:
            return
        self._stopped = True
        self._reusable = False
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # -- the end --------------------------------------------------------------------------

    def connectionLost(self, reason: Failure = _DONE) -> None:
        state, self.state = self.state, DEAD
        self._lost = True
        self._pool.lost(self)
        d, self._d = self._d, None
        if d is not None and not d.called:
            d.errback(ResponseNeverReceived([reason]))
        response, self._response = self._response, None
        if state == BODY and response is not None:
            if self._mode == CLOSE and not self._stopped:
                response.bodyEnded(Failure(PotentialDataLoss()))
            elif self._stopped:
                response.bodyEnded(Failure(ResponseFailed([reason])))
            else:
                response.bodyEnded(Failure(ResponseFailed([reason, Failure(_DataLoss())])))
        closed, self._closed = self._closed, []
        for waiter in closed:
            waiter.callback(None)

    def whenClosed(self) -> defer.Deferred[None]:
        """Fires once the connection is closed."""
        d: defer.Deferred[None] = defer.Deferred()
        if self._lost:
            d.callback(None)
        else:
            self._closed.append(d)
        return d


def _canonicalName(name: bytes) -> bytes:
    """A header name the way twisted's ``Headers`` stores it."""
    cached = _NAMES.get(name)
    if cached is None:
        probe = Headers()
        probe.addRawHeader(name, b"")
        cached = next(iter(probe._rawHeaders))
        if len(_NAMES) < 512:
            _NAMES[name] = cached
    return cached


_NAMES: dict[bytes, bytes] = {}
