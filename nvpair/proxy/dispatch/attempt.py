"""One upstream attempt and its commit gate (spec §5.1-§5.3).

An attempt dials the node's addresses in order, waits for headers (header timeout), then
holds the response at the gate until its first body byte (first-content timeout).  The
first byte commits; a timeout, a transport error, a retryable status (unless this is the
final attempt, or the status is the same failure another node answered: the request's
fault, spec §6) or the target leaving discovery end the attempt uncommitted.  Commit and
cancellation are one claim on ``state``: whichever comes first wins, the other is a no-op.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from twisted.internet import defer
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair.proxy.dispatch.interfaces import IAttemptExchange, IBodyGate, IDiscoveryWatcher
from nvpair.proxy.dispatch.outcome import Committed, Failed, ICommittedBody
from nvpair.proxy.dispatch.relay import Relay, discard, stopReceiving
from nvpair.proxy.dispatch.upstream import addressesFor
from nvpair.proxy.endings import FailureKind
from nvpair.proxy.engines import RouteClass
from nvpair.proxy.flow.breaker import retryAfterSeconds
from nvpair.proxy.flow.interfaces import IMovable
from nvpair.proxy.interfaces import IStallWatch
from nvpair.proxy.placement.interfaces import IOutcome
from nvpair.proxy.routing.nodes import Node

__all__ = ["Attempt", "AttemptState", "discard", "retryableStatus"]


class AttemptState(Enum):
    """Who claimed the attempt: nobody yet, the commit, or its abandonment."""

    PENDING = "pending"
    COMMITTED = "committed"
    ABANDONED = "abandoned"


PENDING: Final = AttemptState.PENDING
COMMITTED: Final = AttemptState.COMMITTED
ABANDONED: Final = AttemptState.ABANDONED


def retryableStatus(status: int, modelRouted: bool) -> bool:
    """The §5.4 table: 408, 429 and 5xx are retried; 404 only on a route sent to the owners
    of a model (inference, token counts)."""
    return status >= 500 or status in (408, 429) or (status == 404 and modelRouted)


# How an upstream body ends cleanly (a close-delimited body ends with PotentialDataLoss).
_CLEAN_ENDS = (ResponseDone, PotentialDataLoss)

_DONE = Failure(ResponseDone())


@implementer(IBodyGate, ICommittedBody, IDiscoveryWatcher, IMovable)
class Attempt:
    """One try of one node."""

    __slots__ = (
        "exchange",
        "node",
        "final",
        "gated",
        "sameFailure",
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

    def __init__(
        self,
        exchange: IAttemptExchange,
        node: Node,
        final: bool,
        gated: bool,
        sameFailure: int | None = None,
    ) -> None:
        self.exchange = exchange
        self.node = node
        self.final = final
        self.gated = gated
        self.sameFailure = sameFailure  # a status that is the answer (the request's fault)
        self.state: AttemptState = PENDING
        self._result: defer.Deferred[IOutcome] = defer.Deferred(self._cancel)
        self._pending: defer.Deferred[IResponse] | None = None
        self._relay: Relay | None = None
        self._timer: IDelayedCall | None = None
        self._response: IResponse | None = None
        self._committed: Committed | None = None
        self._headerTimedOut = False
        self._watch: IStallWatch | None = None
        facade = exchange.facade
        facade.watch(node.id, self)
        self._addresses = addressesFor(node, facade.localBackend, facade.confirmed.get(node.id))

    def start(self) -> defer.Deferred[IOutcome]:
        """Begin the attempt; the Deferred fires with ``Committed`` or ``Failed``.  The first
        attempt of a streamed inference request, not its last, is watched for waiting in
        its engine's queue (standalone: ``flow.enginequeues``)."""
        ex = self.exchange
        queues, model = ex.context.engineQueues, ex.model
        if queues is not None and self.gated and not self.final and ex.attempts == 1:
            if model is not None and ex.facts.stream:
                facade = ex.facade
                queues.watch(
                    self,
                    model,
                    lambda: facade.snapshot.owners(model, facade.hasLocalBackend),
                    len(ex.body),
                )
        self._dial(0)
        return self._result

    # -- before headers -------------------------------------------------------------------

    def _dial(self, index: int) -> None:
        if index >= len(self._addresses):
            self._fail(FailureKind.TRANSPORT)
            return
        ex = self.exchange
        address = self._addresses[index]
        d: defer.Deferred[IResponse]
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
        d.addCallbacks(
            self._gotResponse, self._requestFailed, callbackArgs=(address,), errbackArgs=(index,)
        )

    def _connected(self) -> None:
        """The dial is done: the header cap starts now (the budgets run in sequence, §5.1)."""
        if self.state is not PENDING or self._timer is not None:
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
        if self.state is not PENDING or pending is None:
            return
        self._headerTimedOut = True
        pending.cancel()

    def _requestFailed(self, failure: Failure, index: int) -> None:
        self._pending = None
        self._stopTimer()
        if self.state is not PENDING:
            return
        if self._headerTimedOut:
            self._fail(FailureKind.HEADER_TIMEOUT)
            return
        if failure.check(ConnectError) and index + 1 < len(self._addresses):
            self._dial(index + 1)
            return
        self.exchange.facade.confirmed.pop(self.node.id, None)
        self._fail(FailureKind.TRANSPORT)

    def _gotResponse(self, response: IResponse, address: str) -> None:
        self._pending = None
        if self.state is not PENDING:
            self._stopTimer()
            discard(response, self.exchange.clock, 0)
            return
        if not self.node.isSelf:
            self.exchange.facade.confirmed[self.node.id] = address
        status = response.code
        if (
            not self.final
            and status != self.sameFailure
            and retryableStatus(status, self.exchange.routeClass is not RouteClass.VERBATIM)
        ):
            self._stopTimer()
            discard(response, self.exchange.clock)
            wait = retryAfterSeconds(response.headers.getRawHeaders(b"retry-after"))
            self._fail(FailureKind.STATUS, status, retryAfter=wait)
            return
        # The header timer keeps running: ``headersArrived`` (synchronous, from
        # ``deliverBody``) turns it into the first-content timer or stops it.
        self._response = response
        relay = self._relay = Relay(self)
        response.deliverBody(relay)

    # -- the gate -------------------------------------------------------------------------

    def headersArrived(self) -> None:
        """Headers are in: start the first-content timer, or commit at once when ungated."""
        relay = self._relay
        assert relay is not None
        if self.state is not PENDING:
            self._stopTimer()
            stopReceiving(relay)
            return
        if not self.gated:
            if self.commit():
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
        if self.state is not PENDING:
            return
        self.state = ABANDONED
        if self._relay is not None:
            stopReceiving(self._relay)
        self._fail(FailureKind.NO_CONTENT, abandoned=True)

    def commit(self) -> bool:
        """Claim the attempt for commit; False when cancellation claimed it first."""
        if self.state is not PENDING:
            return False
        self.state = COMMITTED
        self._stopTimer()
        self._unwatch()
        response = self._response
        assert response is not None
        length = None if response.length is UNKNOWN_LENGTH else int(response.length)
        relay = self._relay
        assert relay is not None
        # A body protocol's transport is the response's producer (see ``stopReceiving``).
        transport: IPushProducer = relay.transport  # type: ignore[assignment]
        self._watch = self.exchange.context.stalls.watch(transport, self.exchange, self.node.id)
        if self._watch is not None:
            transport = self._watch
        committed = Committed(self.node, response.code, self)
        try:
            self.exchange.writeHead(committed, response.phrase, response.headers, length, transport)
        except Exception:
            # Nothing sensible can be streamed: stop the body, let the loop report it.
            transport.stopProducing()
            self._result.errback()
            return False
        self._committed = committed
        self._result.callback(committed)
        if self._watch is not None:
            self._watch.start()
        return True

    def bodyLost(self, reason: Failure) -> None:
        """The upstream body ended: finish the stream, or end the attempt if nothing committed."""
        clean = isinstance(reason.value, _CLEAN_ENDS)
        if self._watch is not None:
            self._watch.stop()
        if self.state is PENDING:
            relay = self._relay
            assert relay is not None
            if clean and self.commit():
                relay.committed = True
            else:
                self.exchange.facade.confirmed.pop(self.node.id, None)
                self._fail(FailureKind.TRANSPORT, abandoned=True)
                return
        committed = self._committed
        if self.state is not COMMITTED or committed is None or committed.ending is not None:
            return
        ending = self.exchange.endBody(clean)
        if committed.ending is None:
            committed.ending = ending
            self.exchange.bodyEnded(committed)

    def stopBody(self) -> None:
        """The exchange cancelled the committed body (client gone, shutdown): stop reading it."""
        if self._watch is not None:
            self._watch.stop()
        if self._relay is not None:
            stopReceiving(self._relay)

    # -- endings --------------------------------------------------------------------------

    def _stopTimer(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _fail(
        self,
        kind: FailureKind,
        status: int | None = None,
        abandoned: bool = False,
        retryAfter: float | None = None,
    ) -> None:
        if self.state is PENDING:
            self.state = ABANDONED
        elif not abandoned:
            return
        self._stopTimer()
        self._unwatch()
        if not self._result.called:
            self._failed(Failed(kind, self.node, status, retryAfter))

    def _failed(self, outcome: Failed) -> None:
        """Report the uncommitted ending to the exchange, then fire the attempt's Deferred."""
        try:
            self.exchange.attemptFailed(outcome)
        except Exception:
            self._result.errback()  # the loop reports it, as it would its own crash
            return
        self._result.callback(outcome)

    def _unwatch(self) -> None:
        ex = self.exchange
        ex.facade.unwatch(self.node.id, self)
        queues = ex.context.engineQueues
        if queues is not None:
            queues.discard(self)

    def left(self) -> None:
        """The target left discovery: abandon unless already committed."""
        self._giveUp(FailureKind.LEFT)

    def move(self) -> bool:
        """It waits in its engine's queue while another owner has room: give it up,
        uncommitted (the request is placed again); False when it is over already."""
        return self._giveUp(FailureKind.MOVED)

    def _giveUp(self, kind: FailureKind) -> bool:
        if self.state is not PENDING:
            return False
        self.state = ABANDONED
        self._abort()
        self._stopTimer()
        self._unwatch()
        if not self._result.called:
            self._failed(Failed(kind, self.node))
        return True

    def _abort(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.cancel()
        if self._relay is not None:
            stopReceiving(self._relay)

    def _cancel(self, d: defer.Deferred[IOutcome]) -> None:
        """The request's scope was cancelled (client gone, shutdown) before commit."""
        if self.state is not PENDING:
            return
        self.state = ABANDONED
        self._stopTimer()
        self._unwatch()
        self._abort()
