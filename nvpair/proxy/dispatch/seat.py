"""One exchange's standing with standalone flow control (spec §11 "The queue",
"Placement"): whether it waits in the fair queue, is held for a node, or goes on, and how
the breakers order its owners; under a broker (no ``IQueueing``) it always goes on."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.endings import FailureKind
from nvpair.proxy.flow.interfaces import IQueueing
from nvpair.proxy.placement.interfaces import NO_BACKLOG, Backlog, IPlacementExchange, ISeat
from nvpair.proxy.routing.facts import NO_IDENTITY
from nvpair.proxy.tracing.interfaces import IRequestTrace

if TYPE_CHECKING:
    from nvpair.proxy.interfaces import IAttemptReport
    from nvpair.proxy.routing.nodes import Node, OwnerSplit

STATUS = FailureKind.STATUS
TRANSPORT = FailureKind.TRANSPORT

__all__ = ["QueueSeat", "Standing"]


class Standing(Enum):
    """Where a request stands with the fair queue."""

    NEW = "new"  # not charged to its client yet
    CHARGED = "charged"  # charged (it went on, or waited): a later round only checks room
    LET_OUT = "let out"  # just let out of the queue (and charged): it goes on


@implementer(ISeat)
class QueueSeat:
    """One exchange's standing with the standalone queue, holds and breakers: what it
    answers for ``IPlacementExchange.seat`` (nothing under a broker, where ``queueing`` is
    None)."""

    __slots__ = ("queueing", "exchange", "headers", "standing", "suspect")

    def __init__(
        self, queueing: IQueueing | None, exchange: IPlacementExchange, headers: Headers
    ) -> None:
        self.queueing = queueing
        self.exchange = exchange
        self.headers = headers  # the client's request headers (its key, for fairness)
        self.standing = Standing.NEW
        self.suspect: IAttemptReport | None = None  # a 5xx whose fault is not known yet

    def waitForRoom(self, owners: Sequence[Node]) -> defer.Deferred[None] | None:
        """None to go on now; else wait in the queue: a Deferred that fires once dispatched
        (or fails with ``CancelledError`` once answered ``queue_full``/``queue_timeout``);
        the client is told apart by the request's ``headers`` and body (protocol §9's
        client rule: ``IQueueing.clientOf``)."""
        queueing = self.queueing
        ex = self.exchange
        if queueing is None or ex.model is None:
            return None
        if self.standing is Standing.LET_OUT:
            self.standing = Standing.CHARGED  # just let out (and charged): it goes on
            return None
        if self.standing is Standing.CHARGED and not queueing.knownFull(owners, ex.model):
            return None  # a later round, already charged
        values = self.headers.getRawHeaders(b"authorization")
        authorization = values[0] if values else None
        identity = NO_IDENTITY if authorization else ex.facts.identity
        wait = queueing.waitForRoom(ex, owners, queueing.clientOf(authorization, identity))
        self.standing = Standing.CHARGED if wait is None else Standing.LET_OUT
        return _traced(wait, ex.trace)

    def holdFor(self, node: Node, seconds: float) -> defer.Deferred[None] | None:
        """Hold the request in the proxy for ``node``'s next free slot, at most ``seconds``
        (``Queueing.holdFor``; traced as a queue wait); None when it cannot be held."""
        if self.queueing is None:
            return None
        return _traced(self.queueing.holdFor(node.id, seconds), self.exchange.trace)

    def knownFull(self, owners: Sequence[Node]) -> bool:
        """Whether every one of ``owners`` is known full (the next round waits in the queue
        instead of backing off)."""
        queueing = self.queueing
        return queueing is not None and queueing.knownFull(owners, self.exchange.model)

    def loadStarted(self) -> None:
        """It goes to start a load of its model: what its queue waited so far is paid."""
        queueing, ex = self.queueing, self.exchange
        if queueing is not None and ex.model is not None:
            queueing.loadStarted(ex.facade, ex.model)

    def crowded(self) -> bool:
        """Whether other requests wait in the proxy (``IQueueing.crowded``; never under a
        broker)."""
        return self.queueing is not None and self.queueing.crowded()

    def backlog(self) -> Backlog:
        """Its model's queue: how many wait, what they waited lately (none under a broker)."""
        queueing, ex = self.queueing, self.exchange
        if queueing is None or ex.model is None:
            return NO_BACKLOG
        return queueing.backlog(ex.facade, ex.model)

    # -- whose fault a failure is (spec §6 "Status handling") ----------------------------

    def attemptFailed(self, outcome: IAttemptReport) -> None:
        """An attempt failed uncommitted.  A busy answer teaches the ledger (no breaker);
        a transport failure or a retryable status counts toward its node's breaker; but a
        5xx other than 503 is held as a suspect: if the next node answers the same status,
        the request is at fault (``sameFailure``), otherwise that node was."""
        queueing = self.queueing
        if outcome.kind is STATUS and queueing is not None:
            if queueing.busyAnswer(outcome.node.id, outcome.status, outcome.retryAfter):
                return
        if outcome.kind is not STATUS and outcome.kind is not TRANSPORT:
            return
        self._blameSuspect()
        if _poisonable(outcome.status):
            self.suspect = outcome
        elif queueing is not None:
            queueing.nodeFailed(outcome.node.id, outcome.retryAfter)

    def sameFailure(self, node: Node) -> int | None:
        """The status that, answered by ``node``, is the request's fault and its answer
        (the suspect's, from another node), else None."""
        suspect = self.suspect
        if suspect is None or suspect.node.id == node.id:
            return None
        return suspect.status

    def committed(self, nodeId: str, status: int) -> None:
        """A response committed on ``nodeId``: the suspect's node is blamed unless this
        is the same failure (the request's fault: no node is blamed)."""
        suspect, self.suspect = self.suspect, None
        if suspect is not None and status == suspect.status and nodeId != suspect.node.id:
            return
        if suspect is not None and self.queueing is not None:
            self.queueing.nodeFailed(suspect.node.id, suspect.retryAfter)
        if self.queueing is not None:
            self.queueing.committed(nodeId, status)

    def ended(self) -> None:
        """The request ended: a suspect never confirmed is its node's failure."""
        self._blameSuspect()

    def _blameSuspect(self) -> None:
        suspect, self.suspect = self.suspect, None
        if suspect is not None and self.queueing is not None:
            self.queueing.nodeFailed(suspect.node.id, suspect.retryAfter)

    def demote(self, owners: Sequence[Node]) -> OwnerSplit:
        """``owners`` split: those to order as usual, the known full, the broken."""
        if self.queueing is None:
            return owners, (), ()
        return self.queueing.demote(owners, self.exchange.model)


def _poisonable(status: int | None) -> bool:
    """Whether a failure with ``status`` may be the request's fault: a 5xx other than 503
    (an engine's busy or unavailable, whatever it is asked)."""
    return status is not None and status >= 500 and status != 503


def _traced(
    wait: defer.Deferred[None] | None, trace: IRequestTrace | None
) -> defer.Deferred[None] | None:
    """``wait``, traced as a ``queue-wait`` span ended with how it ended."""
    if wait is not None and trace is not None:
        trace.queueWaitStarted()
        wait.addBoth(_waitEnded, trace)
    return wait


def _waitEnded(result: object, trace: IRequestTrace) -> object:
    """A traced queue wait ended: ``dispatched``, or ``left`` (answered ``queue_full`` or
    ``queue_timeout``, or its client gone)."""
    trace.queueWaitEnded("left" if isinstance(result, Failure) else "dispatched")
    return result
