"""A lean HTTP/1.1 client for the request path: one write per request, responses parsed by
llhttp (``httptools``), strict.

``pool.ConnectionPool.request`` sends one serialized request over a pooled keep-alive
connection (or a new one from an endpoint) and fires with a ``response.Response``, an
``IResponse`` (``code``, ``phrase``, ``headers``, ``length``, ``deliverBody``).  The
connection knows its pool only as an ``IConnectionPool`` (``interfaces``).  The body
protocol's transport pauses, resumes and stops the upstream read (llhttp cannot pause: the
connection's *transport* is paused, and what one read already held is passed on).  The
payload of one socket read reaches the body protocol as one ``dataReceived``; a read that
breaks the framing passes nothing on.

The answer to the current request is in one ``Answer`` state, changed only by ``_to``
(``NEXT`` lists the transitions).  Once it is complete nothing after it is parsed into it:
llhttp's first callback for a later byte stops the parser, and a read of a head, or one
ending in a CR or LF (bytes llhttp skips without a callback), is fed in two parts, so an
answer complete before the last byte has bytes after it.  Such an answer is ``OVERRUN``: it
stands as framed, its connection is closed, never pooled, and counted
(``IConnectionPool.bytesAfterAnswer``).

Ends: ``ResponseDone`` for a body that ended as framed, ``PotentialDataLoss`` for a
close-delimited body ended by a clean close, ``ResponseFailed`` (``BadResponse`` inside when
the engine broke HTTP/1.1) for the rest.  Only a ``DONE`` answer, not to HEAD, is pooled
(but a chunked one from an engine known to close after it: ``framing.closesAfterChunked``);
any parse error aborts.  Left to us by llhttp: interims are skipped, a HEAD answer ends at its
head, a close-delimited body at the close, ``101`` and codings but ``chunked`` are errors,
the head and framing bytes between payload bytes are bounded (``framing``).
"""

from __future__ import annotations

from collections.abc import Hashable

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser
from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair.proxy.http.answer import (
    DONE,
    ENDED,
    HEAD,
    INTERIM,
    LAST,
    NEXT,
    OPEN,
    OVERRUN,
    STOPPED,
    Answer,
)
from nvpair.proxy.http.fastwrite import sendNow
from nvpair.proxy.http.framing import (
    MAX_BODY_OVERHEAD,
    MAX_HEAD,
    BadResponse,
    closesAfterChunked,
    responseHead,
)
from nvpair.proxy.http.interfaces import (
    ConnectionState,
    IBodyConnection,
    IConnectionPool,
    IPooledConnection,
    IStreamTransport,
)
from nvpair.proxy.http.peek import SocketPeek, socketPeek
from nvpair.proxy.http.response import Response

_DONE = Failure(ResponseDone())

IDLE = ConnectionState.IDLE
WAITING = ConnectionState.WAITING
BODY = ConnectionState.BODY
DEAD = ConnectionState.DEAD


_LINE_ENDS = (10, 13)  # LF, CR: what llhttp skips silently between messages


class _Stop(Exception):
    """Raised from a callback to stop llhttp: nothing after this point is parsed."""


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
        self.answer = HEAD
        # What llhttp reported during the current read / response.
        self._phrase = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._headCode = 0  # the final status once its head is complete, else 0
        self._parts: list[bytes] = []
        self._closeDelimited = False
        self._closesAfter = False  # the engine closes after this answer though it says keep-alive
        self._headBytes = 0
        self._overhead = 0  # bytes read since the last payload byte
        self._pausedByBody = False  # flow control: two requests, what the transport was told
        self._held = False
        self._readPaused = False
        self._closed: list[defer.Deferred[None]] | None = []  # None once closed
        self.peek: SocketPeek | None = None  # set once connected
        # A direct dial (``pool.DirectTCP``) fires this with the connection once made.
        self.whenMade: defer.Deferred[HTTPClientConnection] | None = None

    def connectionMade(self) -> None:
        assert self.transport is not None
        try:
            self.transport.setTcpNoDelay(True)
        except OSError:
            pass
        self.peek = socketPeek(self.transport)
        made, self.whenMade = self.whenMade, None
        if made is not None and not made.called:
            made.callback(self)

    def _to(self, answer: Answer) -> None:
        """The one place the answer's state changes (``NEXT`` lists the transitions)."""
        assert answer in NEXT[self.answer], (self.answer, answer)
        self.answer = answer

    # -- sending --------------------------------------------------------------------------

    def send(self, data: bytes, method: bytes, d: defer.Deferred[IResponse]) -> None:
        """Write one request; ``d`` fires with its response (or fails)."""
        self.state = WAITING
        self._d = d
        self._isHead = method == b"HEAD"
        self._phrase = b""
        self._fields = []
        self._headCode = 0
        self.answer = HEAD
        self._closeDelimited = self._closesAfter = False
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

    def _after(self) -> None:
        """llhttp reports something after the complete answer: stop it there."""
        self._overrun()
        raise _Stop()

    def _overrun(self) -> None:
        if self.answer is not OVERRUN:
            self._to(OVERRUN)

    def on_message_begin(self) -> None:
        if self.answer in ENDED:
            self._after()  # a message after the answer: nobody asked for it

    def on_status(self, status: bytes) -> None:
        self._phrase += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._headCode:  # trailer fields (after the head) are dropped
            self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        code = self._parser.get_status_code()
        if code < 200:  # an interim answer: the final one follows
            self._to(INTERIM)
            self._phrase = b""
            self._fields = []
            return
        self._headCode = code
        self._to(LAST if self._isHead else OPEN)  # a HEAD answer ends at its head

    def on_body(self, body: bytes) -> None:
        if self.answer is OPEN:
            self._parts.append(body)
        else:
            self._after()  # after a HEAD answer's head: not part of the answer

    def on_message_complete(self) -> None:
        answer = self.answer
        if answer is INTERIM:
            self._to(HEAD)
        elif answer is OPEN:  # llhttp knows keep-alive only until the message ends
            self._to(DONE if self._parser.should_keep_alive() else LAST)

    # -- receiving ------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state is BODY:
            if self.answer is STOPPED:
                return
        elif state is WAITING:
            self._headBytes += len(data)
        else:
            if data:  # bytes nobody asked for: the connection cannot be trusted
                self._unasked(state is IDLE)
            return
        if not self._parse(data, state is WAITING):
            return
        if state is WAITING and not self._headReceived():
            return
        parts = self._parts
        answer = self.answer
        if parts:
            self._parts = []
            self._overhead = 0
            response = self._response
            if response is not None and self.answer is not STOPPED:
                response.bodyData(parts[0] if len(parts) == 1 else b"".join(parts))
        elif state is BODY and answer is OPEN:
            self._overhead += len(data)
            if self._overhead > MAX_BODY_OVERHEAD and self.state is BODY:
                self._protocolError("too many framing bytes without payload")
                return
        if self.answer in ENDED and self.state is BODY:
            self._finish()

    def _unasked(self, idle: bool) -> None:
        if self.answer is DONE or self.answer is LAST:
            self._to(OVERRUN)
            self._pool.bytesAfterAnswer(self)
        if idle:
            self.state = DEAD
            self._pool.lost(self)  # never handed out again
            self.abort()

    def _parse(self, data: bytes, head: bool) -> bool:
        """Feed one read to llhttp (a head's, or one ending in CR or LF, in two parts: the
        last byte apart); False if it broke the framing (the request failed)."""
        parser = self._parser
        try:
            if len(data) > 1 and (head or data[-1] in _LINE_ENDS):
                view = memoryview(data)
                parser.feed_data(view[:-1])
                if self.answer in ENDED:
                    self._overrun()  # the last byte came after the answer
                    return True
                parser.feed_data(view[-1:])
            else:
                parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as e:
            if self.answer in ENDED:
                self._overrun()  # garbage after a complete answer: that answer stands
                return True
            self._parts = []  # the read that broke the framing passes nothing on
            self._protocolError(str(e) or type(e).__name__)
            return False
        return True

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
            self._closesAfter = closesAfterChunked(head.headers)
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
        if self.answer is DONE and not self._isHead and not self._closesAfter:
            self.state = IDLE
            self._pausedByBody = self._held = False
            if self._readPaused:
                self._readPaused = False
                assert self.transport is not None
                self.transport.resumeProducing()
            self._pool.release(self)
        else:
            if self.answer is OVERRUN:
                self._pool.bytesAfterAnswer(self)
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
        if self.state is not BODY or self.answer is STOPPED:
            return
        self._to(STOPPED)
        if self.transport is not None:
            self.transport.abortConnection()

    # -- the end --------------------------------------------------------------------------

    def connectionLost(self, reason: Failure = _DONE) -> None:
        state, self.state = self.state, DEAD
        self._pool.lost(self)
        d, self._d = self._d, None
        if d is not None and not d.called:
            d.errback(ResponseNeverReceived([reason]))
        response, self._response = self._response, None
        if state is BODY and response is not None:
            ended = self._closeDelimited and self.answer is not STOPPED
            if ended and reason.check(ConnectionDone):
                response.bodyEnded(Failure(PotentialDataLoss()))
            else:
                response.bodyEnded(Failure(ResponseFailed([reason])))
        closed, self._closed = self._closed, None
        for waiter in closed or ():
            waiter.callback(None)

    def whenClosed(self) -> defer.Deferred[None]:
        """Fires once the connection is closed."""
        d: defer.Deferred[None] = defer.Deferred()
        if self._closed is None:
            d.callback(None)
        else:
            self._closed.append(d)
        return d
