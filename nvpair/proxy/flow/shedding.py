"""Admission by predicted wait over one queue (spec §11 "The queue"): the rate a queue lets
requests out at, the depth that rate lets start before ``--queue-timeout``, the waiting
requests to refuse at once when every owner is full, and the ``Retry-After`` a refusal
carries.  The arithmetic is ``flow.predicted``'s; this module applies it to a ``FairQueue``
and the room ledger's service figures, on the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.flow.fairqueue import MAX_RETRY_AFTER, FairQueue, Ticket
from nvpair.proxy.flow.predicted import (
    OBSERVED_SAMPLES,
    allKept,
    bound,
    ceilingRate,
    keptInTime,
    serviceRate,
)

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node
    from nvpair.proxy.settings import Settings

__all__ = ["Service", "Shedding"]

T = TypeVar("T")


class Service(Protocol):
    """What the room ledger (``nodestate.ledger.RoomLedger``) tells of a node's service."""

    def capacity(self, nodeId: str) -> int | None: ...
    def serviceTime(self, nodeId: str) -> float | None: ...
    def serviceSamples(self, nodeId: str) -> int: ...
    def serviceAtLeast(self, nodeId: str) -> float | None: ...


class Shedding:
    """The drain rate, bound, shedding and ``Retry-After`` of the proxy's queues."""

    def __init__(self, settings: Settings, clock: IReactorTime, service: Service) -> None:
        self.settings = settings
        self.clock = clock
        self.service = service

    def drainRate(self, queue: FairQueue[T], owners: Callable[[], Sequence[Node]]) -> float | None:
        """How fast ``queue`` can let requests out, per second: what it let out lately, else
        what its ``owners`` (asked only then) can take; None while neither is known."""
        observed = queue.drain.perSecond(self.clock.seconds(), OBSERVED_SAMPLES)
        if observed is not None:
            return observed
        service, nodes = self.service, owners()
        return serviceRate(
            (service.capacity(n.id), service.serviceTime(n.id), service.serviceSamples(n.id))
            for n in nodes
        ) or ceilingRate((service.capacity(n.id), service.serviceAtLeast(n.id)) for n in nodes)

    def bound(self, rate: float | None) -> int:
        """The depth a queue draining at ``rate`` keeps to (``flow.predicted.bound``)."""
        settings = self.settings
        return bound(rate, settings.queueTimeout, settings.queueMax)

    def shed(
        self,
        queue: FairQueue[T],
        owners: Callable[[], Sequence[Node]],
        refuse: Callable[[Ticket[T]], None],
    ) -> None:
        """Bound ``queue`` by its drain rate and, once that is known, take out and
        ``refuse`` the waiting requests that could not start before their
        ``--queue-timeout`` ran out (every owner full: ``keptInTime``), those a full queue
        gives up first (``FairQueue.shed``); each is refused while the queue's bound is
        what stays, so its ``Retry-After`` counts only those."""
        rate = self.drainRate(queue, owners)  # once: what bounds the queue is what sheds it
        queue.maxDepth = self.bound(rate)
        if rate is None:
            return
        now, timeout = self.clock.seconds(), self.settings.queueTimeout
        if allKept(queue.oldestSince(), len(queue), now, rate, timeout):
            return  # each starts in time: their waits are not sorted on every drain
        keep = keptInTime((t.since for t in queue), now, rate, timeout)
        if len(queue) <= keep:
            return
        limit, queue.maxDepth = queue.maxDepth, max(1, keep)
        while len(queue) > keep:
            ticket = queue.shed()
            assert ticket is not None  # the queue is not empty
            refuse(ticket)
        queue.maxDepth = limit

    @property
    def fallback(self) -> int:
        """``--retry-after`` (at least 1): the ``Retry-After`` while no rate is known."""
        return max(1, self.settings.retryAfter)

    def retryAfter(self, queue: FairQueue[T], owners: Callable[[], Sequence[Node]]) -> int:
        """Whole seconds until the requests now waiting in ``queue`` (at most its bound)
        are let out at its drain rate (at least 1, at most ``MAX_RETRY_AFTER``);
        ``fallback`` while the rate is unknown."""
        rate = self.drainRate(queue, owners)
        if rate is None:
            return self.fallback
        ahead = max(1, min(len(queue), queue.maxDepth))
        return max(1, min(MAX_RETRY_AFTER, math.ceil(ahead / rate)))
