"""Standalone flow control (spec §11 "The queue", "The breaker"): the fair queue in the
proxy while every owner is known full, and the per-node breakers.

``Queueing`` composes the pure pieces (``flow.fairqueue``, ``flow.breaker``,
``flow.shedding`` for the bound and ``Retry-After`` a drain rate gives) and the room
ledger (``nodestate.ledger``, which says whether a node is known full) with the clock: a
waiting request is a Deferred the placement loop yields, holding no attempt, reservation or
engine connection; it fires when an owner has room (the ledger says room may have appeared:
an engine probe, one of our requests on an owner ending; or a busy mark lapses), and is
cancelled (the request leaves the queue at once) when its client goes.  Over ``--queue-max``
the client with the most waiting is answered 503 ``queue_full`` at once (the arriving
request, or the newest of a longer FIFO whose place it takes), past ``--queue-timeout`` (or
its job deadline) 503 ``queue_timeout`` (or ``deadline_exceeded``), both with a
``Retry-After`` from the drain rate observed.  Under a broker there is none of this.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import implementer

from nvpair.proxy.dispatch.holds import Holds
from nvpair.proxy.dispatch.queueline import Line, Waiter, anyWaiting, oldestFirst
from nvpair.proxy.flow.breaker import Breakers
from nvpair.proxy.flow.clientbook import ClientBook
from nvpair.proxy.flow.clients import Client
from nvpair.proxy.flow.fairqueue import Ticket
from nvpair.proxy.flow.interfaces import IQueueing, QueueRefusal
from nvpair.proxy.flow.shedding import Shedding
from nvpair.proxy.flow.waits import WaitHistogram
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.placement.interfaces import (
    NO_BACKLOG,
    Backlog,
    IFleetView,
    ILoadPlanner,
    IPlacementExchange,
)

if TYPE_CHECKING:
    from nvpair.proxy.routing.facts import Identity
    from nvpair.proxy.routing.nodes import Node, OwnerSplit
    from nvpair.proxy.settings import Settings

__all__ = ["MAX_QUEUES", "Queueing"]

MAX_QUEUES = 256


@implementer(IQueueing)
class Queueing:
    """Every facade and model's queue, the holds and the breakers, over the room ledger."""

    def __init__(
        self,
        settings: Settings,
        clock: IReactorTime,
        ledger: RoomLedger,
        loads: ILoadPlanner | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.ledger = ledger
        self.loads = loads  # which owners a model's requests may use (placement counts loads)
        self.breakers = Breakers()
        self.shedding = Shedding(settings, clock, ledger)  # the queues' bound and Retry-After
        self.holds = Holds(clock, self._hasRoom, settings.queueMax)  # spec §11 "Placement"
        self.lines: OrderedDict[tuple[str, str], Line] = OrderedDict()
        self.refused: dict[tuple[str, QueueRefusal], int] = {}
        self.clients = ClientBook()  # the fleet file's [[client]] entries, counts per client
        self._draining = False
        self._again = False
        self._busyTimer: IDelayedCall | None = None
        ledger.subscribe(self.roomMayHaveAppeared)  # for the life of the process

    # -- what the placement loop asks --------------------------------------------------

    def _hasRoom(self, nodeId: str, model: str | None = None) -> bool:
        """Whether ``nodeId`` has room now (for ``model``: not while it loads there, nor
        while its own slots there are all ours)."""
        if self.ledger.knownFull(nodeId):
            return False
        loads = self.loads
        return model is None or loads is None or not loads.noRoom(nodeId, model)

    def knownFull(self, owners: Sequence[Node], model: str | None = None) -> bool:
        """Whether every one of ``owners`` is known full now (for ``model``: a node where
        it is loading counts as full until the load is done)."""
        for node in owners:
            if self._hasRoom(node.id, model):
                return False
        return bool(owners)

    def usable(self, line: Line) -> tuple[Node, ...]:
        """The owners ``line``'s requests may use now (``Line.usable``)."""
        return line.usable(self.clock.seconds(), self.loads)

    def backlog(self, facade: IFleetView, model: str) -> Backlog:
        """``model``'s queue in ``facade``: how many wait, what its requests waited lately."""
        line = self.lines.get((facade.engine.id, model))
        return NO_BACKLOG if line is None else self._backlog(line)

    def loadStarted(self, facade: IFleetView, model: str) -> None:
        """A request for ``model`` goes to start a load: what its queue waited is paid."""
        if (line := self.lines.get((facade.engine.id, model))) is not None:
            line.loadStarted(self.clock.seconds())

    def engineWaited(self, engineId: str, model: str, seconds: float, since: float) -> None:
        """One of ``model``'s requests waited ``seconds`` for a slot inside an engine."""
        if (line := self.lines.get((engineId, model))) is not None:
            line.engineWaited(seconds, since, self.clock.seconds(), self.loads)

    def _backlog(self, line: Line) -> Backlog:
        return line.backlog(self.clock.seconds(), self.loads)

    def _line(self, facade: IFleetView, model: str) -> Line | None:
        key = (facade.engine.id, model)
        if (line := self.lines.get(key)) is not None:
            line.facade = facade
            self.lines.move_to_end(key)
            return line
        if len(self.lines) >= MAX_QUEUES:
            # Forget the least recently used idle queue (its fairness state only).
            for oldKey, old in self.lines.items():
                if not old.queue:
                    del self.lines[oldKey]
                    break
            else:
                return None
        charge = partial(self.clients.countDispatch, facade.engine.id)
        self.lines[key] = line = Line(facade, model, self.settings.queueMax, charge)
        return line

    def clientOf(self, authorization: bytes | None, identity: Identity) -> Client:
        """The request's client, by the declared clients in force (``ClientBook``)."""
        return self.clients.clientOf(authorization, identity)

    def dispatching(self, facade: IFleetView, model: str, client: Client) -> None:
        """A request goes to the owners without waiting: charge its client's service."""
        line = self._line(facade, model)
        if line is not None:
            line.queue.charge(client)

    def waitForRoom(
        self, ex: IPlacementExchange, owners: Sequence[Node], client: Client
    ) -> defer.Deferred[None] | None:
        """None when ``ex`` may go on now (charged to ``client``); else a Deferred that
        fires when it is dispatched, or fails with ``CancelledError`` once it has been
        answered (full queue, timeout, its place taken) or its client left (cancel it)."""
        model = ex.model
        assert model is not None  # inference requests name their model
        if self.settings.queueMax == 0:
            return None  # --queue-max 0: no queue, requests go to the engines as before
        facade = ex.facade
        line = self.lines.get((facade.engine.id, model))
        waiting = line is not None and bool(line.queue)
        if not waiting and not self.knownFull(owners, model):
            self.dispatching(facade, model, client)
            return None
        now = self.clock.seconds()
        remaining = ex.createdAt + self.settings.jobDeadline - now
        if remaining <= 0:
            return None  # the loop answers deadline_exceeded before any dispatch
        line = self._line(facade, model)
        waiter = Waiter(ex, line is not None and line.paid(now, self.loads))
        ticket = Ticket(client, now, waiter)
        if line is not None:
            rate = self.shedding.drainRate(line.queue, self._owners(line))
            line.queue.maxDepth = self.shedding.bound(rate)
        left = ticket if line is None else line.queue.push(ticket)
        if line is None or left is ticket:
            self._refuse(ex, line, QueueRefusal.FULL, client)
            return defer.fail(defer.CancelledError())
        waiter.deferred = defer.Deferred(lambda _: self._leave(line, ticket))
        timeout = self.settings.queueTimeout
        reason = QueueRefusal.TIMEOUT if timeout <= remaining else QueueRefusal.DEADLINE
        waiter.timer = self.clock.callLater(
            min(timeout, remaining), self._expire, line, ticket, reason
        )
        wait = waiter.deferred
        if left is not None:
            self._displaced(line, left)
        self.drain()  # room may have come back since the last event
        return wait

    def holdFor(self, nodeId: str, seconds: float) -> defer.Deferred[None] | None:
        """Hold a request in the proxy for ``nodeId``'s next free slot, at most ``seconds``
        (``Holds.hold``); None when it cannot be held (no queue, or too many held)."""
        if self.settings.queueMax == 0:
            return None
        if self._hasRoom(nodeId):
            return defer.succeed(None)  # room came back since the engine's last report
        return self.holds.hold(nodeId, seconds)

    def crowded(self) -> bool:  # IQueueing.crowded
        return bool(self.holds) or anyWaiting(self.lines.values())

    def _owners(self, line: Line) -> Callable[[], Sequence[Node]]:
        return partial(self.usable, line)

    def _retryAfter(self, line: Line | None) -> int:
        if line is None:
            return self.shedding.fallback
        return self.shedding.retryAfter(line.queue, self._owners(line))

    def _refuse(
        self,
        ex: IPlacementExchange,
        line: Line | None,
        reason: QueueRefusal,
        client: Client | None = None,
    ) -> None:
        engineId = ex.facade.engine.id
        key = (engineId, reason)
        self.refused[key] = self.refused.get(key, 0) + 1
        if client is not None:
            self.clients.countRefusal(engineId, client, reason)
        ex.answerError(503, reason.value, self._retryAfter(line))

    def _displaced(self, line: Line, ticket: Ticket[Waiter]) -> None:
        """A full queue gave ``ticket``'s place to a client with fewer waiting: answered
        ``queue_full`` (already out of the queue)."""
        waiter = ticket.payload
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        self._refuse(waiter.exchange, line, QueueRefusal.FULL, ticket.client)
        waiter.deferred.cancel()

    def _leave(self, line: Line, ticket: Ticket[Waiter]) -> None:
        """The waiting request was cancelled (client gone, shutdown): out of the queue."""
        line.queue.remove(ticket)
        timer = ticket.payload.timer
        if timer is not None and timer.active():
            timer.cancel()

    def _expire(self, line: Line, ticket: Ticket[Waiter], reason: QueueRefusal) -> None:
        waiter = ticket.payload
        waiter.timer = None
        if not line.queue.remove(ticket):
            return
        self._refuse(waiter.exchange, line, reason, ticket.client)
        waiter.deferred.cancel()

    # -- dispatching waiters ----------------------------------------------------------

    def drain(self) -> None:
        """Dispatch waiting requests, least-served client first, while an owner has room."""
        if self._draining:
            self._again = True
            return
        self._draining = True
        try:
            again = True
            while again:
                self._again = False
                self.holds.release()  # held for one node: they were placed before the queue
                for line in oldestFirst(self.lines.values(), self.clock.seconds()):
                    self._drainLine(line)
                again = self._again
        finally:
            self._draining = False
        self._armBusyTimer()

    def _drainLine(self, line: Line) -> None:
        """Let out the waiting requests of ``line`` while an owner has room; then, every
        slot taken, refuse those that could not start in time (``Shedding.shed``)."""
        queue = line.queue
        while queue:
            if self.knownFull(self.usable(line), line.model):
                self.shedding.shed(line.queue, self._owners(line), partial(self._displaced, line))
                return
            now = self.clock.seconds()
            ticket = queue.pop(now)
            assert ticket is not None
            waiter = ticket.payload
            if waiter.timer is not None and waiter.timer.active():
                waiter.timer.cancel()
            line.left(ticket.since, now, self.loads, waiter.underLoad)
            waiter.deferred.callback(None)

    def _armBusyTimer(self) -> None:
        """While requests wait, wake up when the earliest learnt limit of an owner grows."""
        timer = self._busyTimer
        if timer is not None and timer.active():
            timer.cancel()
        self._busyTimer = None
        now = self.clock.seconds()
        wake: float | None = None
        for line in self.lines.values():
            if not line.queue:
                continue
            for node in line.owners():
                until = self.ledger.wakeAt(node.id)
                if until > now and (wake is None or until < wake):
                    wake = until
        if wake is not None:
            self._busyTimer = self.clock.callLater(wake - now, self._busyLapsed)

    def _busyLapsed(self) -> None:
        self._busyTimer = None
        self.drain()

    # -- events -------------------------------------------------------------------------

    def roomMayHaveAppeared(self, nodeId: str) -> None:
        """The ledger says ``nodeId`` may have room now: drain, unless that would do nothing."""
        if self._busyTimer is not None or self.crowded():
            self.drain()

    def busyAnswer(self, nodeId: str, status: int | None, retryAfter: float | None) -> bool:
        """Whether ``nodeId``'s refusal with ``status`` is busy (the ledger learns its limit)."""
        return status is not None and self.ledger.busyAnswer(nodeId, status, retryAfter)

    def nodeFailed(self, nodeId: str, retryAfter: float | None) -> None:
        """A fast failure that was ``nodeId``'s fault: one toward its breaker."""
        self.breakers.failed(nodeId, self.clock.seconds(), retryAfter)

    def committed(self, nodeId: str, status: int | None) -> None:
        """A response committed on ``nodeId``: below 500 (not 429) it served us; a 5xx or
        429 is a failure unless it was a busy answer (the seat decides whose fault)."""
        if status is not None and (status >= 500 or status == 429):
            if not self.busyAnswer(nodeId, status, None):
                self.nodeFailed(nodeId, None)
            return
        self.breakers.succeeded(nodeId)
        self.ledger.served(nodeId)

    def demote(self, owners: Sequence[Node], model: str | None = None) -> OwnerSplit:
        """``owners`` split: those to order as usual, then the known-full ones (while another
        owner has room; for ``model``, as ``knownFull`` says), then those whose breaker is
        open, each in their order."""
        preferred, demoted = self.breakers.order(owners, self.clock.seconds())
        full = tuple([node for node in preferred if not self._hasRoom(node.id, model)])
        if not full or len(full) == len(preferred):
            return preferred, (), demoted
        # Owners with room first (a request let out of the queue goes where the room is).
        roomy = tuple(node for node in preferred if node not in full)
        return roomy, full, demoted

    # -- read by the ops views -------------------------------------------------------------

    def depths(self) -> list[tuple[str, str, int, float, WaitHistogram]]:
        """Per facade and model with a queue: depth, oldest wait now, wait histogram."""
        now = self.clock.seconds()
        return [
            (engine, model, len(line.queue), line.queue.oldestWait(now), line.waits)
            for (engine, model), line in self.lines.items()
        ]
