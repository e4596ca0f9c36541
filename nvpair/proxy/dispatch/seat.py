"""One exchange's standing with standalone flow control (spec §11 "The queue",
"Placement"): whether it waits in the fair queue, is held for a node, or goes on, and how
the breakers order its owners; under a broker (no ``IQueueing``) it always goes on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.proxy.flow.clients import clientKey
from nvpair.proxy.flow.interfaces import IQueueing
from nvpair.proxy.placement.interfaces import IPlacementExchange
from nvpair.proxy.tracing.interfaces import IRequestTrace

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node, OwnerSplit

__all__ = ["QueueSeat"]


class QueueSeat:
    """One exchange's standing with the standalone queue and breakers: what it answers for
    ``IPlacementExchange.waitForRoom``, ``knownFull`` and ``demote`` (nothing under a broker,
    where ``queueing`` is None)."""

    __slots__ = ("queueing", "queued")

    def __init__(self, queueing: IQueueing | None) -> None:
        self.queueing = queueing
        self.queued = 0  # 0: not charged to its client yet; 1: charged; 2: just let out

    def waitForRoom(
        self,
        ex: IPlacementExchange,
        headers: Headers,
        owners: Sequence[Node],
        trace: IRequestTrace | None = None,
    ) -> defer.Deferred[None] | None:
        """None to go on now; else wait in the queue: a Deferred that fires once dispatched
        (or fails with ``CancelledError`` once answered ``queue_full``/``queue_timeout``);
        the client is told apart by the request's ``headers`` and body (``clientKey``)."""
        queueing = self.queueing
        if queueing is None or ex.model is None:
            return None
        state = self.queued
        if state == 2:
            self.queued = 1  # just let out (and charged): it goes on
            return None
        if state == 1 and not queueing.knownFull(owners):
            return None  # a later round, already charged
        values = headers.getRawHeaders(b"authorization")
        authorization = values[0] if values else None
        user = ex.facts.identity.user
        document: dict[str, object] | None = None if user is None else {"user": user}
        # Peer requests are served on the local backend and never routed here: no peer id.
        wait = queueing.waitForRoom(ex, owners, clientKey(authorization, document, None))
        self.queued = 1 if wait is None else 2
        return _traced(wait, trace)

    def holdFor(
        self, node: Node, seconds: float, trace: IRequestTrace | None = None
    ) -> defer.Deferred[None] | None:
        """Hold the request in the proxy for ``node``'s next free slot, at most ``seconds``
        (``Queueing.holdFor``; traced as a queue wait); None when it cannot be held."""
        if self.queueing is None:
            return None
        return _traced(self.queueing.holdFor(node.id, seconds), trace)

    def knownFull(self, owners: Sequence[Node]) -> bool:
        """Whether every one of ``owners`` is known full (the next round waits in the queue
        instead of backing off)."""
        return self.queueing is not None and self.queueing.knownFull(owners)

    def demote(self, owners: Sequence[Node]) -> OwnerSplit:
        """``owners`` split: those to order as usual, the known full, the broken."""
        if self.queueing is None:
            return owners, (), ()
        return self.queueing.demote(owners)


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
