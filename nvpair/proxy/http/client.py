"""A lean HTTP/1.1 client for the request path: one write per request, responses parsed by
llhttp (``httptools``), strict.

``pool.ConnectionPool.request`` sends one serialized request over a pooled keep-alive
connection (or a new one from an endpoint) and fires with a ``Response`` (``response``),
an ``IResponse`` (``code``, ``phrase``, ``headers``, ``length``, ``deliverBody``).  The
connection knows its pool only as an ``IConnectionPool`` (``interfaces``).  The body
protocol's transport pauses, resumes and stops the upstream read (llhttp cannot pause: the
connection's *transport* is paused, and what one read already held is passed on).  The
payload of one socket read reaches the body protocol as one ``dataReceived``; a read that
breaks the framing passes nothing on.

Ends: ``ResponseDone`` for a body that ended as framed, ``PotentialDataLoss`` for a
close-delimited body ended by a clean close, ``ResponseFailed`` for everything else
(``BadResponse`` inside when the engine broke HTTP/1.1).  A connection is pooled again only
after a response that ended as framed, that llhttp says may be kept alive, with no bytes
after it and not to HEAD; any parse error aborts it.  What llhttp leaves to us: interim 1xx
answers are skipped, a HEAD response ends at its head, a close-delimited body ends at the
close, ``101`` (never asked for) and a transfer coding other than ``chunked`` are errors, and
the head and the framing bytes between payload bytes are bounded (``framing``).
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser
from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair.proxy.http.fastwrite import sendNow
from nvpair.proxy.http.framing import (
    MAX_BODY_OVERHEAD,
    MAX_HEAD,
    BadResponse,
    responseHead,
    serializeRequest,
)
from nvpair.proxy.http.interfaces import (
    ConnectionState,
    IBodyConnection,
    IConnectionPool,
    IPooledConnection,
    IStreamTransport,
)
from nvpair.proxy.http.response import Response

__all__ = ["BadResponse", "HTTPClientConnection", "Response", "serializeRequest"]

_DONE = Failure(ResponseDone())

IDLE = ConnectionState.IDLE
WAITING = ConnectionState.WAITING
BODY = ConnectionState.BODY
DEAD = ConnectionState.DEAD


class Answer(Enum):
    """How far llhttp got in the answer to the current request."""

    OPEN = "open"  # its head or body is being read
    INTERIM = "interim"  # inside an interim (1xx) answer: the final one follows
    ENDED = "ended"  # the final answer's message ended


OPEN = Answer.OPEN
INTERIM = Answer.INTERIM
ENDED = Answer.ENDED


@implementer(IPooledConnection, IBodyConnection)
class HTTPClientConnection(Protocol):
    """One keep-alive connection to an upstream: one request at a time."""

    transport: IStreamTransport | None

    def __init__(self, pool: IConnectionPool, key: Hashable) -> None:
        self._pool = pool
        self.key = key
        self.state = IDLE
        self.idleSince = 0.0
        self._parser = HttpResponseParser(self)
        self._d: defer.Deferred[IResponse] | None = None
        self._isHead = False
        self._response: Response | None = None
        # What llhttp reported during the current read / response.
        self._phrase = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._headCode = 0  # the final status once its head is complete, else 0
        self._parts: list[bytes] = []
        self._answer = OPEN
        self._keepAlive = False  # the answer ended, and llhttp said the connection may be kept
        self._extra = False  # bytes came after the answer
        self._closeDelimited = False
        self._headBytes = 0
        self._overhead = 0  # bytes read since the last payload byte
        self._stopped = False
        self._pausedByBody = False
        self._held = False
        self._readPaused = False  # whether the transport's reading is paused by us
        self._closed: list[defer.Deferred[None]] = []
        self._lost = False
        # A direct dial (``pool.DirectTCP``) fires this with the connection once made.
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

    def send(self, data: bytes, method: bytes, d: defer.Deferred[IResponse]) -> None:
        """Write one request; ``d`` fires with its response (or fails)."""
        self.state = WAITING
        self._d = d
        self._isHead = method == b"HEAD"
        self._phrase = b""
        self._fields = []
        self._headCode = 0
        self._answer = OPEN
        self._keepAlive = self._extra = False
        self._stopped = False
        self._closeDelimited = False
        self._headBytes = self._overhead = 0
        transport = self.transport
        assert transport is not None  # requests are sent once the connection is made
        sendNow(transport, data)

    def abort(self) -> None:
        """Drop the connection at once (a cancelled request)."""
        self._d = None
        if self.transport is not None:
            self.transport.abortConnection()

    # -- llhttp's callbacks (during ``feed_data``) -----------------------------------------

    def on_message_begin(self) -> None:
        if self._answer is ENDED:
            self._extra = True  # a message after the answer: nobody asked for it

    def on_status(self, status: bytes) -> None:
        self._phrase += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._headCode:  # trailer fields (after the head) are dropped
            self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        code = self._parser.get_status_code()
        if code < 200:  # an interim answer: the final one follows
            if self._answer is OPEN:
                self._answer = INTERIM
            self._phrase = b""
            self._fields = []
            return
        self._headCode = code
        if self._isHead:
            self._answer = ENDED  # llhttp would wait for a body a HEAD answer never has

    def on_body(self, body: bytes) -> None:
        if self._answer is not ENDED:
            self._parts.append(body)

    def on_message_complete(self) -> None:
        if self._answer is INTERIM:
            self._answer = OPEN
        else:
            self._answer = ENDED
            self._keepAlive = self._parser.should_keep_alive()  # only known until it ends

    # -- receiving ------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state is BODY:
            if self._stopped:
                return
        elif state is WAITING:
            self._headBytes += len(data)
        else:
            if state is IDLE:
                self.abort()  # bytes nobody asked for: the connection cannot be trusted
            return
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as e:
            if self._answer is not ENDED:
                self._parts = []  # the read that broke the framing passes nothing on
                self._protocolError(str(e) or type(e).__name__)
                return
            self._extra = True  # garbage after a complete answer: that answer stands
        if state is WAITING and not self._headReceived():
            return
        parts = self._parts
        if parts:
            self._parts = []
            self._overhead = 0
            response = self._response
            if response is not None and not self._stopped:
                response.bodyData(parts[0] if len(parts) == 1 else b"".join(parts))
        elif state is BODY and self._answer is not ENDED:
            self._overhead += len(data)
            if self._overhead > MAX_BODY_OVERHEAD and self.state is BODY:
                self._protocolError("too many framing bytes without payload")
                return
        if self._answer is ENDED and self.state is BODY and not self._stopped:
            self._finish()

    def _headReceived(self) -> bool:
        """After a read while waiting: hand out the response once its head is in.  False
        while it is not (or the head broke a rule, which ends the request)."""
        code = self._headCode
        if not code:
            if self._headBytes > MAX_HEAD:
                self._protocolError("response head too large")
            return False
        head = responseHead(code, self._phrase, self._fields)
        self._fields = []
        length: int | str = UNKNOWN_LENGTH
        noBody = self._isHead or code == 204 or code == 304
        if noBody:
            if code != 204 and head.contentLength is not None:
                length = head.contentLength  # the engine's, as HEAD and 304 may carry it
        elif head.transferEncoding is not None:
            if head.transferEncoding != b"chunked":
                self._protocolError("unsupported transfer coding")
                return False
        elif head.contentLength is not None:
            length = head.contentLength
        else:
            self._closeDelimited = True
        response = self._response = Response(self, code, head.phrase, head.headers, length)
        self.state = BODY
        d, self._d = self._d, None
        if d is not None:
            d.callback(response)
        return True

    def _finish(self) -> None:
        """The body ended as framed: back to the pool (or closed), then tell the response."""
        response, self._response = self._response, None
        if self._keepAlive and not self._extra and not self._isHead:
            self.state = IDLE
            self._pausedByBody = self._held = False
            if self._readPaused:
                self._readPaused = False
                assert self.transport is not None
                self.transport.resumeProducing()
            self._pool.release(self)
        else:
            self.state = DEAD
            if self.transport is not None:
                self.transport.loseConnection()
        if response is not None:
            response.bodyEnded(_DONE)

    def _protocolError(self, problem: str) -> None:
        error = Failure(BadResponse(problem))
        d, self._d = self._d, None
        response, self._response = self._response, None
        self.state = DEAD
        if self.transport is not None:
            self.transport.abortConnection()
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
        transport = self.transport
        if transport is None or self.state is not BODY:
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
        if self.state is not BODY:
            return
        self._stopped = True
        if self.transport is not None:
            self.transport.abortConnection()

    # -- the end --------------------------------------------------------------------------

    def connectionLost(self, reason: Failure = _DONE) -> None:
        state, self.state = self.state, DEAD
        self._lost = True
        self._pool.lost(self)
        d, self._d = self._d, None
        if d is not None and not d.called:
            d.errback(ResponseNeverReceived([reason]))
        response, self._response = self._response, None
        if state is BODY and response is not None:
            if self._closeDelimited and not self._stopped and reason.check(ConnectionDone):
                response.bodyEnded(Failure(PotentialDataLoss()))
            else:
                response.bodyEnded(Failure(ResponseFailed([reason])))
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
