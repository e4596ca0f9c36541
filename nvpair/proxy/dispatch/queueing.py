"""Standalone flow control (spec §11 "The queue", "The breaker"): the fair queue in the
proxy while every owner is known full, and the per-node breakers.

``Queueing`` composes the pure pieces (``flow.fairqueue``, ``flow.room``,
``flow.breaker``) with the clock: a waiting request is a Deferred the placement loop
yields, holding no attempt, reservation or engine connection; it fires when an owner has
room (an engine probe says so, one of our requests on an owner ends, a busy mark lapses),
and is cancelled (the request leaves the queue at once) when its client goes.  Over
``--queue-max`` the client with the most waiting is answered 503 ``queue_full`` at once
(the arriving request, or the newest of a longer FIFO whose place it takes), past
``--queue-timeout``
(or its job deadline) 503 ``queue_timeout`` (or ``deadline_exceeded``), both with a
``Retry-After`` from the drain rate observed.  Under a broker there is none of this.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import implementer

from nvpair.proxy.dispatch.holds import Holds
from nvpair.proxy.flow.breaker import Breakers
from nvpair.proxy.flow.clientbook import ClientBook
from nvpair.proxy.flow.clients import Client
from nvpair.proxy.flow.fairqueue import FairQueue, Ticket
from nvpair.proxy.flow.interfaces import IQueueing
from nvpair.proxy.flow.waits import WaitHistogram
from nvpair.proxy.nodestate.interfaces import IEngineStates
from nvpair.proxy.nodestate.room import MAX_NODES as MAX_SERVED
from nvpair.proxy.nodestate.room import SERVED_RECENTLY, RoomBoard, isBusyAnswer
from nvpair.proxy.placement.interfaces import IFleetView, IPlacementExchange

if TYPE_CHECKING:
    from nvpair.proxy.routing.facts import Identity
    from nvpair.proxy.routing.nodes import Node, OwnerSplit
    from nvpair.proxy.settings import Settings

__all__ = ["MAX_QUEUES", "Queueing"]

MAX_QUEUES = 256


class _Waiter:
    __slots__ = ("exchange", "deferred", "timer")

    def __init__(self, exchange: IPlacementExchange) -> None:
        self.exchange = exchange
        self.deferred: defer.Deferred[None]  # set once queued: its canceller needs the ticket
        self.timer: IDelayedCall | None = None


class _Line:
    """One facade and model's queue, with what it needs to find the model's owners."""

    __slots__ = ("facade", "model", "queue", "waits")

    def __init__(
        self,
        facade: IFleetView,
        model: str,
        maxDepth: int,
        charged: Callable[[Client], None] | None = None,
    ) -> None:
        self.facade = facade
        self.model = model
        self.queue: FairQueue[_Waiter] = FairQueue(maxDepth, charged)
        self.waits = WaitHistogram()

    def owners(self) -> tuple[Node, ...]:
        facade = self.facade
        return facade.snapshot.owners(self.model, facade.hasLocalBackend)


@implementer(IQueueing)
class Queueing:
    """The queues of every facade and model, the room board and the breakers."""

    def __init__(
        self,
        settings: Settings,
        clock: IReactorTime,
        inFlight: dict[str, int],
        states: IEngineStates | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.inFlight = inFlight  # ``Activity.inFlight``: our requests per node, live
        self.board = RoomBoard(states)
        self.breakers = Breakers()
        self.holds = Holds(clock, self._hasRoom, settings.queueMax)  # spec §11 "Placement"
        self.lines: OrderedDict[tuple[str, str], _Line] = OrderedDict()
        self.served: OrderedDict[str, float] = OrderedDict()  # when each node last served ours
        self.refused: dict[tuple[str, str], int] = {}
        self.clients = ClientBook()  # the fleet file's [[client]] entries, counts per client
        self._draining = False
        self._again = False
        self._busyTimer: IDelayedCall | None = None
        if states is not None:
            states.subscribe(self.probed)  # for the life of the process

    # -- what the placement loop asks --------------------------------------------------

    def _hasRoom(self, nodeId: str, now: float) -> bool:
        return self.board.hasRoom(nodeId, self.inFlight.get(nodeId, 0), now)

    def knownFull(self, owners: Sequence[Node]) -> bool:
        """Whether every one of ``owners`` is known full now."""
        if not owners:
            return False
        now = self.clock.seconds()
        return not any(self._hasRoom(node.id, now) for node in owners)

    def _line(self, facade: IFleetView, model: str) -> _Line | None:
        key = (facade.engine.id, model)
        line = self.lines.get(key)
        if line is not None:
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
        engineId = facade.engine.id
        line = self.lines[key] = _Line(
            facade,
            model,
            self.settings.queueMax,
            lambda client: self.clients.countDispatch(engineId, client),
        )
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
        if not waiting and not self.knownFull(owners):
            self.dispatching(facade, model, client)
            return None
        now = self.clock.seconds()
        remaining = ex.createdAt + self.settings.jobDeadline - now
        if remaining <= 0:
            return None  # the loop answers deadline_exceeded before any dispatch
        line = self._line(facade, model)
        waiter = _Waiter(ex)
        ticket = Ticket(client, now, waiter)
        left = ticket if line is None else line.queue.push(ticket)
        if line is None or left is ticket:
            self._refuse(ex, line, "queue_full", client)
            return defer.fail(defer.CancelledError())
        waiter.deferred = defer.Deferred(lambda _: self._leave(line, ticket))
        timeout = self.settings.queueTimeout
        reason = "queue_timeout" if timeout <= remaining else "deadline_exceeded"
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
        if self._hasRoom(nodeId, self.clock.seconds()):
            return defer.succeed(None)  # room came back since the engine's last report
        return self.holds.hold(nodeId, seconds)

    def _retryAfter(self, line: _Line | None) -> int:
        fallback = self.settings.retryAfter
        if line is None:
            return max(1, fallback)
        return line.queue.drain.retryAfter(len(line.queue), self.clock.seconds(), fallback)

    def _refuse(
        self,
        ex: IPlacementExchange,
        line: _Line | None,
        reason: str,
        client: Client | None = None,
    ) -> None:
        engineId = ex.facade.engine.id
        key = (engineId, reason)
        self.refused[key] = self.refused.get(key, 0) + 1
        if client is not None:
            self.clients.countRefusal(engineId, client, reason)
        ex.answerError(503, reason, self._retryAfter(line))

    def _displaced(self, line: _Line, ticket: Ticket[_Waiter]) -> None:
        """A full queue gave ``ticket``'s place to a client with fewer waiting: answered
        ``queue_full`` (already out of the queue)."""
        waiter = ticket.payload
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        self._refuse(waiter.exchange, line, "queue_full", ticket.client)
        waiter.deferred.cancel()

    def _leave(self, line: _Line, ticket: Ticket[_Waiter]) -> None:
        """The waiting request was cancelled (client gone, shutdown): out of the queue."""
        line.queue.remove(ticket)
        timer = ticket.payload.timer
        if timer is not None and timer.active():
            timer.cancel()

    def _expire(self, line: _Line, ticket: Ticket[_Waiter], reason: str) -> None:
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
                for line in list(self.lines.values()):
                    self._drainLine(line)
                again = self._again
        finally:
            self._draining = False
        self._armBusyTimer()

    def _drainLine(self, line: _Line) -> None:
        queue = line.queue
        while queue:
            owners = line.owners()
            now = self.clock.seconds()
            if owners and not any(self._hasRoom(node.id, now) for node in owners):
                return
            ticket = queue.pop(now)
            assert ticket is not None
            waiter = ticket.payload
            if waiter.timer is not None and waiter.timer.active():
                waiter.timer.cancel()
            line.waits.observe(now - ticket.since)
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
                until = self.board.wakeAt(node.id)
                if until > now and (wake is None or until < wake):
                    wake = until
        if wake is not None:
            self._busyTimer = self.clock.callLater(wake - now, self._busyLapsed)

    def _busyLapsed(self) -> None:
        self._busyTimer = None
        self.drain()

    # -- events -------------------------------------------------------------------------

    def activityChanged(self, nodeId: str, delta: int) -> None:
        """Our in-flight count on ``nodeId`` changed (``Activity``'s listener)."""
        if delta > 0:
            self.board.started(nodeId)
            return
        self.board.ended(nodeId)
        if self.lines or self.holds:
            self.drain()

    def probed(self, nodeId: str) -> None:
        """A fresh engine probe of ``nodeId`` (``IEngineStates.subscribe``)."""
        self.board.probed(nodeId)
        if self.lines or self.holds:
            self.drain()

    def attemptFailed(
        self, nodeId: str, kind: str, status: int | None, retryAfter: float | None
    ) -> None:
        """An attempt on ``nodeId`` ended uncommitted: a busy mark, or a breaker failure."""
        now = self.clock.seconds()
        others = self.inFlight.get(nodeId, 0)
        served = self.served.get(nodeId)
        recently = served is not None and now - served <= SERVED_RECENTLY
        if kind == "status" and isBusyAnswer(status, others, recently):
            self.board.busy(nodeId, now, retryAfter, others)
            return
        if kind in ("status", "transport"):
            self.breakers.failed(nodeId, now, retryAfter)

    def committed(self, nodeId: str, status: int | None) -> None:
        """A response committed on ``nodeId`` (a final attempt's 5xx is a failure)."""
        if status is not None and (status >= 500 or status == 429):
            self.attemptFailed(nodeId, "status", status, None)
            return
        self.breakers.succeeded(nodeId)
        served = self.served
        served[nodeId] = self.clock.seconds()
        served.move_to_end(nodeId)
        while len(served) > MAX_SERVED:
            served.popitem(last=False)

    def demote(self, owners: Sequence[Node]) -> OwnerSplit:
        """``owners`` split: those to order as usual, then the known-full ones (while another
        owner has room), then those whose breaker is open, each in their order."""
        now = self.clock.seconds()
        preferred, demoted = self.breakers.order(owners, now)
        full = tuple(node for node in preferred if not self._hasRoom(node.id, now))
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
