"""One queue of the fair queue (``queueing.Queueing``): a facade and model's waiting
requests, what they waited, and how to find the model's owners (spec §11 "The queue")."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall

from nvpair.proxy.flow.clients import Client
from nvpair.proxy.flow.fairqueue import FairQueue
from nvpair.proxy.flow.waits import WaitHistogram
from nvpair.proxy.placement.interfaces import (
    NO_BACKLOG,
    Backlog,
    IFleetView,
    ILoadPlanner,
    IPlacementExchange,
)

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node

__all__ = ["DRAIN_TURN", "WAITED_TAU", "Accrued", "Line", "Waiter", "anyWaiting"]

WAITED_TAU = 60.0  # seconds: the time constant of what a queue's requests waited lately
DRAIN_TURN = 0.01  # seconds: dispatched this soon after a drain, it was let out by it


class Accrued:
    """Seconds waited, decaying with a time constant of ``WAITED_TAU`` seconds."""

    __slots__ = ("value", "at")

    def __init__(self) -> None:
        self.value = 0.0
        self.at = 0.0

    def now(self, now: float) -> float:
        """The decayed total at ``now``."""
        return self.value * math.exp(-max(0.0, now - self.at) / WAITED_TAU)

    def clear(self) -> None:
        """Nothing waited from now on."""
        self.value = 0.0

    def add(self, seconds: float, now: float) -> None:
        """A request waited ``seconds`` (it left the queue at ``now``)."""
        self.value = self.now(now) + max(0.0, seconds)
        self.at = now


class Waiter:
    """One request waiting in a queue: its exchange, its Deferred and its timeout, and
    whether a load was paying for its queue when it came (``Line.paid``)."""

    __slots__ = ("exchange", "underLoad", "deferred", "timer")

    def __init__(self, exchange: IPlacementExchange, underLoad: bool = False) -> None:
        self.exchange = exchange
        self.underLoad = underLoad
        self.deferred: defer.Deferred[None]  # set once queued: its canceller needs the ticket
        self.timer: IDelayedCall | None = None


class Line:
    """One facade and model's queue, with what it needs to find the model's owners."""

    __slots__ = ("facade", "model", "queue", "waits", "waited", "paidAt", "drainedAt")

    def __init__(
        self,
        facade: IFleetView,
        model: str,
        maxDepth: int,
        charged: Callable[[Client], None] | None = None,
    ) -> None:
        self.facade = facade
        self.model = model
        self.queue: FairQueue[Waiter] = FairQueue(maxDepth, charged)
        self.waits = WaitHistogram()
        self.waited = Accrued()  # seconds its requests waited lately (decayed)
        self.paidAt = -math.inf  # the last moment a load of the model was seen paying
        self.drainedAt = -math.inf  # ... a request that came while one paid was let out

    def loadStarted(self, now: float) -> None:
        """A request goes to start a load of the model: what the queue waited is paid."""
        self.waited.clear()
        self.paidAt = now

    def backlog(self, now: float, loads: ILoadPlanner | None) -> Backlog:
        """How many wait, and what they waited lately that no load pays (``paid``: only
        while some wait, since the mark matters only to requests queued before it)."""
        if self.queue.depth:
            self.paid(now, loads)
        return self.waiting(now)

    def waiting(self, now: float) -> Backlog:
        """What ``backlog`` answers, without noting anything paid."""
        depth = self.queue.depth
        if not depth:
            return NO_BACKLOG if not self.waited.value else Backlog(0, self.waited.now(now))
        return Backlog(depth, self.waited.now(now))

    def left(
        self, since: float, now: float, loads: ILoadPlanner | None, underLoad: bool = False
    ) -> None:
        """A request queued at ``since`` leaves the queue at ``now``: what counts towards
        a further copy is only what it waited after a load of the model was last seen in
        progress (while a copy loads, the wait is that copy's to pay), and nothing when it
        came while a load paid (``underLoad``: the queue built up during a load drains
        once it is done, and that drain is the load's to pay too)."""
        self.paid(now, loads)
        self.waits.observe(now - since)
        if underLoad:
            self.drainedAt = now
        else:
            self.waited.add(now - max(since, self.paidAt), now)

    def engineWaited(
        self, seconds: float, since: float, now: float, loads: ILoadPlanner | None
    ) -> None:
        """One of the model's requests, dispatched at ``since``, waited ``seconds`` for a
        slot inside its engine: it counts as a wait in the queue does, unless a load was
        seen paying since it was dispatched, or it was dispatched no later than the queue
        that built up during a load was let out (that drain is the load's to pay)."""
        self.paid(now, loads)
        if since > self.paidAt and since > self.drainedAt + DRAIN_TURN:
            self.waited.add(seconds, now)

    def paid(
        self, now: float, loads: ILoadPlanner | None, owners: tuple[Node, ...] | None = None
    ) -> bool:
        """Note ``now`` as paid when a copy of the model is loading on an owner
        (``owners``: as ``owners()`` says now): what its requests wait meanwhile is that
        load's to pay; whether one is.  Another model loading beside a copy pays nothing:
        each model's slots are its own (Ollama's runners, llama-server's children)."""
        if loads is None:
            return False
        for node in self.owners() if owners is None else owners:
            if loads.loading(node.id, self.model):
                self.paidAt = now
                return True
        return False

    def usable(self, now: float, loads: ILoadPlanner | None) -> tuple[Node, ...]:
        """The owners this line's requests may use now (``ILoadPlanner.plan``)."""
        owners = self.owners()
        if loads is None:
            return owners
        if self.queue.depth:
            self.paid(now, loads, owners)  # as ``backlog`` notes it, before the plan reads
        if loads.warm(owners, self.model):
            return owners  # what the plan would answer: every owner (no backlog built)
        return loads.plan(owners, self.model, self.waiting(now)).usable

    def owners(self) -> tuple[Node, ...]:
        facade = self.facade
        return facade.snapshot.owners(self.model, facade.hasLocalBackend)


def oldestFirst(lines: Iterable[Line], now: float) -> list[Line]:
    """The lines where requests wait, the one whose request has waited longest first (a
    slot freed on a node serving several models goes to the oldest wait, of any model)."""
    waiting = [line for line in lines if line.queue.depth]
    if len(waiting) > 1:  # one line (one model waiting, the usual case) has no order to find
        waiting.sort(key=lambda line: -line.queue.oldestWait(now))
    return waiting


def anyWaiting(lines: Iterable[Line]) -> bool:
    """Whether a request waits in any of ``lines``."""
    for line in lines:
        if line.queue.depth:
            return True
    return False
