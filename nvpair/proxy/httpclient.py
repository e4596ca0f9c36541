"""A lean HTTP/1.1 client for the request path: one write per request, byte-level parsing.

``httppool.ConnectionPool.request`` sends one serialized request over a pooled keep-alive
connection (or a new one from an endpoint) and fires with a ``Response`` (``httpresponse``)
that has the ``IResponse`` surface the proxy uses (``code``, ``phrase``, ``headers``,
``length``, ``deliverBody``).  The body protocol's transport pauses, resumes and stops the
upstream read.  Bodies are Content-Length, chunked or close-delimited; the chunk payloads of
one socket read reach the body protocol as one ``dataReceived``.  Clean ends are
``ResponseDone`` (``PotentialDataLoss`` for a close-delimited body), anything else is
``ResponseFailed`` -- the same reasons twisted.web's Agent gives.  This module is the
connection (its states, flow control and ends); the framing rules -- the request's bytes,
the head parser, the chunked decoder -- are ``httpframing``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss, _DataLoss

from nvpair.proxy.fastwrite import sendNow
from nvpair.proxy.httpframing import (
    CHUNKED,
    CLOSE,
    LENGTH,
    MAX_HEAD,
    BadResponse,
    ChunkDecoder,
    parseHead,
    serializeRequest,
    splitHead,
)
from nvpair.proxy.httpresponse import Response

if TYPE_CHECKING:
    from nvpair.proxy.httppool import ConnectionPool

__all__ = ["BadResponse", "HTTPClientConnection", "Response", "serializeRequest"]

_DONE = Failure(ResponseDone())

# Connection states.
IDLE, WAITING, BODY, DEAD = range(4)


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
        self._chunks = ChunkDecoder()
        self._reusable = False
        self._stopped = False
        self._pausedByBody = False
        self._held = False
        self._readPaused = False  # whether the transport's reading is paused by us
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
            split = splitHead(buf)
            if split is None:
                if len(buf) > MAX_HEAD:
                    self._protocolError("response head too large")
                    return
                self._buf = buf
                return
            head, buf = split
            try:
                parsed = parseHead(head, self._method == b"HEAD")
            except (BadResponse, ValueError):
                self._protocolError("malformed response head")
                return
            if parsed is not None:
                break  # otherwise an interim 1xx answer: parse the next head
        code, phrase, headers, length, mode, self._remaining, self._reusable = parsed
        self._mode = mode
        if mode == CHUNKED:
            self._chunks.reset()
        self._buf = b""
        response = self._response = Response(self, code, phrase, headers, length)
        self.state = BODY
        d, self._d = self._d, None
        if length == 0 and mode != CLOSE:
            self._finish(buf)
            if d is not None:
                d.callback(response)
            return
        if d is not None:
            d.callback(response)
        if buf and self.state == BODY and not self._stopped:
            self._bodyReceived(buf)

    def _bodyReceived(self, data: bytes) -> None:
        response = self._response
        assert response is not None
        mode = self._mode
        if mode == CHUNKED:
            try:
                payload, rest = self._chunks.feed(data)
            except BadResponse as e:
                self._protocolError(str(e))
                return
            if payload:
                response.bodyData(payload)
            if rest is not None and self.state == BODY and not self._stopped:
                self._finish(rest)
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

    def _finish(self, rest: bytes) -> None:
        """The body ended cleanly: back to the pool (or closed), then tell the response."""
        response, self._response = self._response, None
        self._buf = b""
        if self._reusable and not rest and not self._stopped:
            self.state = IDLE
            self._pausedByBody = self._held = False
            if self._readPaused:
                self._readPaused = False
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
        paused = self._pausedByBody or self._held
        if paused != self._readPaused:  # the transport is told only of changes
            self._readPaused = paused
            if paused:
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
