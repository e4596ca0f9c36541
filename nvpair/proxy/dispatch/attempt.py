"""One upstream attempt and its commit gate (spec §5.1-§5.3).

An attempt dials the node's addresses in order, waits for headers (header timeout), then
holds the response at the gate until its first body byte (first-content timeout).  The
first byte commits; a timeout, a transport error, a retryable status (unless this is the
final attempt) or the target leaving discovery end the attempt uncommitted.  Commit and
cancellation are one claim on ``state``: whichever comes first wins, the other is a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse

from nvpair.proxy.dispatch.stallwatch import StallWatch
from nvpair.proxy.dispatch.upstream import addressesFor

if TYPE_CHECKING:
    from nvpair.proxy.dispatch.exchange import Exchange

PENDING = 0
COMMITTED = 1
ABANDONED = 2

# Outcome kinds of an uncommitted attempt.  On the final permitted attempt ``NO_CONTENT``
# (headers, then no first byte in time) answers 504; every other kind answers 502.
TRANSPORT = "transport"  # dial failure, connection lost before the first body byte
HEADER_TIMEOUT = "header_timeout"  # connected, but no headers within the header cap
STATUS = "status"  # a retryable status on a non-final attempt
NO_CONTENT = "no_content"  # headers arrived, the first body byte did not (first-content cap)
LEFT = "left"  # the target left discovery before commit

# How the body of a committed response ended.
COMPLETE = "complete"
TRUNCATED = "truncated"
CLIENT_GONE = "client_gone"


def retryableStatus(status: int, inference: bool) -> bool:
    """The §5.4 table: 408, 429 and 5xx are retried; 404 only on an inference route."""
    return status >= 500 or status in (408, 429) or (status == 404 and inference)


# How an upstream body ends cleanly (a close-delimited body ends with PotentialDataLoss).
_CLEAN_ENDS = (ResponseDone, PotentialDataLoss)


class Committed:
    """The attempt's response is the client's answer.

    ``ending`` is how its body ended (None while it streams); ``over`` is set once the
    body ended or the exchange cancelled it, after which the attempt reports nothing more.
    """

    __slots__ = ("node", "status", "attempt", "ending", "over")

    def __init__(self, node: Any, status: int, attempt: Attempt) -> None:
        self.node = node
        self.status = status
        self.attempt = attempt
        self.ending: str | None = None
        self.over = False


class Failed:
    """The attempt ended without committing."""

    __slots__ = ("kind", "status", "node")

    def __init__(self, kind: str, node: Any, status: int | None = None) -> None:
        self.kind = kind
        self.node = node
        self.status = status


Outcome = Committed | Failed

_DONE = Failure(ResponseDone())


def _stop(protocol: Protocol) -> None:
    """Stop the body a protocol is receiving (its transport is the body's producer)."""
    transport: Any = protocol.transport
    if transport is not None:
        transport.stopProducing()


class _Discard(Protocol):
    """Reads and drops a body we will not forward; stops it if it is large or endless."""

    def __init__(self, limit: int, clock: Any) -> None:
        self._left = limit
        self._timer: IDelayedCall | None = None
        self._clock = clock

    def connectionMade(self) -> None:
        if self._left <= 0:
            _stop(self)
            return
        self._timer = self._clock.callLater(10.0, _stop, self)

    def dataReceived(self, data: bytes) -> None:
        self._left -= len(data)
        if self._left < 0:
            _stop(self)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


def discard(response: IResponse, clock: Any, limit: int = 1 << 20) -> None:
    """Drain an unwanted response so its connection can be reused, within bounds."""
    response.deliverBody(_Discard(limit, clock))


class Relay(Protocol):
    """Receives the response body: gate until the first byte, then stream to the client."""

    __slots__ = ("attempt", "committed")

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.committed = False

    def connectionMade(self) -> None:
        self.attempt.headersArrived(self)

    def dataReceived(self, data: bytes) -> None:
        if self.committed:
            self.attempt.exchange.write(data)
            return
        if self.attempt.commit(self):
            self.committed = True
            self.attempt.exchange.write(data)
        else:
            _stop(self)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        self.attempt.bodyLost(self, reason)


class Attempt:
    """One dispatch to one node."""

    __slots__ = (
        "exchange",
        "node",
        "final",
        "gated",
        "state",
        "_result",
        "_pending",
        "_relay",
        "_timer",
        "_response",
        "_committed",
        "_headerTimedOut",
        "_addresses",
        "_watch",
    )

    def __init__(self, exchange: Exchange, node: Any, final: bool, gated: bool) -> None:
        self.exchange = exchange
        self.node = node
        self.final = final
        self.gated = gated
        self.state = PENDING
        self._result: defer.Deferred[Outcome] = defer.Deferred(self._cancel)
        self._pending: defer.Deferred[IResponse] | None = None
        self._relay: Relay | None = None
        self._timer: IDelayedCall | None = None
        self._response: IResponse | None = None
        self._committed: Committed | None = None
        self._headerTimedOut = False
        self._watch: StallWatch | None = None
        facade = exchange.facade
        facade.watch(node.id, self)
        self._addresses = addressesFor(node, facade.localBackend, facade.confirmed.get(node.id))

    def start(self) -> defer.Deferred[Outcome]:
        """Begin the attempt; the Deferred fires with ``Committed`` or ``Failed``."""
        self._dial(0)
        return self._result

    # -- before headers -------------------------------------------------------------------

    def _dial(self, index: int) -> None:
        if index >= len(self._addresses):
            self._fail(TRANSPORT)
            return
        ex = self.exchange
        address = self._addresses[index]
        try:
            d = ex.upstream.request(
                self.node,
                address,
                ex.method,
                ex.uri,
                ex.forwardHeaders,
                ex.body,
                connected=self._connected,
            )
        except Exception:
            d = defer.fail()
        self._pending = d
        d.addCallbacks(self._gotResponse, self._requestFailed, (address,), None, (index,))

    def _connected(self) -> None:
        """The dial is done: the header cap starts now (the budgets run in sequence, §5.1)."""
        if self.state != PENDING or self._timer is not None:
            return
        timeout = self.exchange.settings.responseHeaderTimeout
        if timeout > 0:
            self._timer = self.exchange.clock.callLater(timeout, self._timedOut)

    def _timedOut(self) -> None:
        """The one timer of the attempt: the header cap, then (reset) the first-content cap."""
        if self._relay is None:
            self._noHeaders()
        else:
            self._noContent()

    def _noHeaders(self) -> None:
        self._timer = None
        pending = self._pending
        if self.state != PENDING or pending is None:
            return
        self._headerTimedOut = True
        pending.cancel()

    def _requestFailed(self, failure: Failure, index: int) -> None:
        self._pending = None
        self._stopTimer()
        if self.state != PENDING:
            return
        if self._headerTimedOut:
            self._fail(HEADER_TIMEOUT)
            return
        if failure.check(ConnectError) and index + 1 < len(self._addresses):
            self._dial(index + 1)
            return
        self.exchange.facade.confirmed.pop(self.node.id, None)
        self._fail(TRANSPORT)

    def _gotResponse(self, response: IResponse, address: str) -> None:
        self._pending = None
        if self.state != PENDING:
            self._stopTimer()
            discard(response, self.exchange.clock, 0)
            return
        if not self.node.isSelf:
            self.exchange.facade.confirmed[self.node.id] = address
        status = response.code
        if not self.final and retryableStatus(status, self.exchange.inference):
            self._stopTimer()
            discard(response, self.exchange.clock)
            self._fail(STATUS, status)
            return
        # The header timer keeps running: ``headersArrived`` (synchronous, from
        # ``deliverBody``) turns it into the first-content timer or stops it.
        self._response = response
        relay = self._relay = Relay(self)
        response.deliverBody(relay)

    # -- the gate -------------------------------------------------------------------------

    def headersArrived(self, relay: Relay) -> None:
        """Headers are in: start the first-content timer, or commit at once when ungated."""
        if self.state != PENDING:
            self._stopTimer()
            _stop(relay)
            return
        if not self.gated:
            if self.commit(relay):
                relay.committed = True
            else:
                self._stopTimer()
            return
        timeout = self.exchange.settings.responseHeaderTimeout
        timer = self._timer
        if timeout <= 0:
            self._stopTimer()
        elif timer is not None and timer.active():
            timer.reset(timeout)  # the first-content cap starts now (§5.1)
        else:
            self._timer = self.exchange.clock.callLater(timeout, self._timedOut)

    def _noContent(self) -> None:
        self._timer = None
        if self.state != PENDING:
            return
        self.state = ABANDONED
        if self._relay is not None:
            _stop(self._relay)
        self._fail(NO_CONTENT, abandoned=True)

    def commit(self, relay: Relay) -> bool:
        """Claim the attempt for commit; False when cancellation claimed it first."""
        if self.state != PENDING:
            return False
        self.state = COMMITTED
        self._stopTimer()
        self._unwatch()
        response = self._response
        assert response is not None
        length = None if response.length is UNKNOWN_LENGTH else int(response.length)
        transport: IPushProducer = relay.transport  # type: ignore[assignment]
        self._watch = self.exchange.context.stalls.watch(transport, self.exchange, self.node.id)
        if self._watch is not None:
            transport = self._watch
        try:
            self.exchange.writeHead(
                self, response.code, response.phrase, response.headers, length, transport
            )
        except Exception:
            # Nothing sensible can be streamed: stop the body, let the loop report it.
            transport.stopProducing()
            self._result.errback()
            return False
        committed = self._committed = Committed(self.node, response.code, self)
        self._result.callback(committed)
        if self._watch is not None:
            self._watch.start()
        return True

    def bodyLost(self, relay: Relay, reason: Failure) -> None:
        """The upstream body ended: finish the stream, or end the attempt if nothing committed."""
        clean = isinstance(reason.value, _CLEAN_ENDS)
        if self._watch is not None:
            self._watch.stop()
        if self.state == PENDING:
            if clean and self.commit(relay):
                relay.committed = True
            else:
                self.exchange.facade.confirmed.pop(self.node.id, None)
                self._fail(TRANSPORT, abandoned=True)
                return
        committed = self._committed
        if self.state != COMMITTED or committed is None or committed.over:
            return
        ending = self.exchange.endBody(clean)
        if not committed.over:
            committed.over = True
            committed.ending = ending
            self.exchange.bodyEnded(committed)

    def stopBody(self) -> None:
        """The exchange cancelled the committed body (client gone, shutdown): stop reading it."""
        if self._watch is not None:
            self._watch.stop()
        if self._relay is not None:
            _stop(self._relay)

    # -- endings --------------------------------------------------------------------------

    def _stopTimer(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _fail(self, kind: str, status: int | None = None, abandoned: bool = False) -> None:
        if self.state == PENDING:
            self.state = ABANDONED
        elif not abandoned:
            return
        self._stopTimer()
        self._unwatch()
        if not self._result.called:
            self._failed(Failed(kind, self.node, status))

    def _failed(self, outcome: Failed) -> None:
        """Report the uncommitted ending to the exchange, then fire the attempt's Deferred."""
        try:
            self.exchange.attemptFailed(outcome)
        except Exception:
            self._result.errback()  # the loop reports it, as it would its own crash
            return
        self._result.callback(outcome)

    def _unwatch(self) -> None:
        self.exchange.facade.unwatch(self.node.id, self)

    def left(self) -> None:
        """The target left discovery: abandon unless already committed."""
        if self.state != PENDING:
            return
        self.state = ABANDONED
        self._abort()
        self._stopTimer()
        self._unwatch()
        if not self._result.called:
            self._failed(Failed(LEFT, self.node))

    def _abort(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.cancel()
        if self._relay is not None:
            _stop(self._relay)

    def _cancel(self, d: defer.Deferred[Outcome]) -> None:
        """The request's scope was cancelled (client gone, shutdown) before commit."""
        if self.state != PENDING:
            return
        self.state = ABANDONED
        self._stopTimer()
        self._unwatch()
        self._abort()
