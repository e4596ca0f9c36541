"""Standalone flow control (spec §11 "The queue", "The breaker"): the fair queue in the
proxy while every owner is known full, and the per-node breakers.

``Queueing`` composes the pure pieces (``flow.fairqueue``, ``flow.room``,
``flow.breaker``) with the clock: a waiting request is a Deferred the placement loop
yields, holding no attempt, reservation or engine connection; it fires when an owner has
room (an engine probe says so, one of our requests on an owner ends, a busy mark lapses),
and is cancelled (the request leaves the queue at once) when its client goes.  Over
``--queue-max`` a request is answered 503 ``queue_full`` at once, past ``--queue-timeout``
(or its job deadline) 503 ``queue_timeout`` (or ``deadline_exceeded``), both with a
``Retry-After`` from the drain rate observed.  Under a broker there is none of this.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.flow.breaker import Breakers
from nvpair.proxy.flow.clients import clientKey
from nvpair.proxy.flow.fairqueue import FairQueue, Ticket
from nvpair.proxy.flow.interfaces import IQueueing
from nvpair.proxy.flow.room import MAX_NODES as MAX_SERVED
from nvpair.proxy.flow.room import SERVED_RECENTLY, RoomBoard, isBusyAnswer
from nvpair.proxy.routing.admission import bodyDocument
from nvpair.proxy.routing.engineview import IEngineStates
from nvpair.proxy.routing.interfaces import IFleetView, IPlacementExchange
from nvpair.proxy.tracing.interfaces import IRequestTrace

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node
    from nvpair.proxy.settings import Settings

__all__ = ["MAX_QUEUES", "WAIT_BUCKETS", "QueueSeat", "Queueing", "WaitHistogram"]

MAX_QUEUES = 256
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WaitHistogram:
    """Time spent in the queue by the requests it dispatched, cumulative (Prometheus)."""

    __slots__ = ("counts", "total", "count", "last")

    def __init__(self) -> None:
        self.counts = [0] * (len(WAIT_BUCKETS) + 1)
        self.total = 0.0
        self.count = 0
        self.last = 0.0

    def observe(self, seconds: float) -> None:
        """Record one wait."""
        index = 0
        while index < len(WAIT_BUCKETS) and seconds > WAIT_BUCKETS[index]:
            index += 1
        self.counts[index] += 1
        self.total += seconds
        self.count += 1
        self.last = seconds


class _Waiter:
    __slots__ = ("exchange", "deferred", "timer")

    def __init__(self, exchange: IPlacementExchange) -> None:
        self.exchange = exchange
        self.deferred: defer.Deferred[None] = defer.Deferred()
        self.timer: IDelayedCall | None = None


class _Line:
    """One facade and model's queue, with what it needs to find the model's owners."""

    __slots__ = ("facade", "model", "queue", "waits")

    def __init__(self, facade: IFleetView, model: str, maxDepth: int) -> None:
        self.facade = facade
        self.model = model
        self.queue: FairQueue[_Waiter] = FairQueue(maxDepth)
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
        self.lines: OrderedDict[tuple[str, str], _Line] = OrderedDict()
        self.served: OrderedDict[str, float] = OrderedDict()  # when each node last served ours
        self.refused: dict[tuple[str, str], int] = {}
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
        line = self.lines[key] = _Line(facade, model, self.settings.queueMax)
        return line

    def dispatching(self, facade: IFleetView, model: str, client: str) -> None:
        """A request goes to the owners without waiting: charge its client's service."""
        line = self._line(facade, model)
        if line is not None:
            line.queue.charge(client)

    def waitForRoom(
        self, ex: IPlacementExchange, owners: Sequence[Node], client: str
    ) -> defer.Deferred[None] | None:
        """None when ``ex`` may go on now (charged to ``client``); else a Deferred that
        fires when it is dispatched, or fails with ``CancelledError`` once it has been
        answered (full queue, timeout) or its client left (cancel it)."""
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
        if line is None or not line.queue.push(ticket):
            self._refuse(ex, line, "queue_full")
            return defer.fail(defer.CancelledError())
        waiter.deferred = defer.Deferred(lambda _: self._leave(line, ticket))
        timeout = self.settings.queueTimeout
        reason = "queue_timeout" if timeout <= remaining else "deadline_exceeded"
        waiter.timer = self.clock.callLater(
            min(timeout, remaining), self._expire, line, ticket, reason
        )
        wait = waiter.deferred
        self.drain()  # room may have come back since the last event
        return wait

    def _retryAfter(self, line: _Line | None) -> int:
        fallback = self.settings.retryAfter
        if line is None:
            return max(1, fallback)
        return line.queue.drain.retryAfter(len(line.queue), self.clock.seconds(), fallback)

    def _refuse(self, ex: IPlacementExchange, line: _Line | None, reason: str) -> None:
        key = (ex.facade.engine.id, reason)
        self.refused[key] = self.refused.get(key, 0) + 1
        ex.answerError(503, reason, self._retryAfter(line))

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
        self._refuse(waiter.exchange, line, reason)
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
        if self.lines:
            self.drain()

    def probed(self, nodeId: str) -> None:
        """A fresh engine probe of ``nodeId`` (``IEngineStates.subscribe``)."""
        self.board.probed(nodeId)
        if self.lines:
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

    def demote(self, owners: Sequence[Node]) -> tuple[Sequence[Node], tuple[Node, ...]]:
        """``owners`` split: those to order as usual, then the rest in their order (nodes whose
        breaker is open; known-full nodes, while another owner has room)."""
        now = self.clock.seconds()
        preferred, demoted = self.breakers.order(owners, now)
        full = [node for node in preferred if not self._hasRoom(node.id, now)]
        if not full or len(full) == len(preferred):
            return preferred, demoted
        # Owners with room first (a request let out of the queue goes where the room is).
        roomy = tuple(node for node in preferred if node not in full)
        return roomy, (*full, *demoted)

    # -- read by the ops views -------------------------------------------------------------

    def depths(self) -> list[tuple[str, str, int, float, WaitHistogram]]:
        """Per facade and model with a queue: depth, oldest wait now, wait histogram."""
        now = self.clock.seconds()
        return [
            (engine, model, len(line.queue), line.queue.oldestWait(now), line.waits)
            for (engine, model), line in self.lines.items()
        ]


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
        document = ex.document
        if document is None and authorization is None:
            document = bodyDocument(ex.body)
        # Peer requests are served on the local backend and never routed here: no peer id.
        wait = queueing.waitForRoom(ex, owners, clientKey(authorization, document, None))
        self.queued = 1 if wait is None else 2
        if wait is not None and trace is not None:
            trace.queueWaitStarted()  # a ``queue-wait`` span, ended with how it ended
            wait.addBoth(_waitEnded, trace)
        return wait

    def knownFull(self, owners: Sequence[Node]) -> bool:
        """Whether every one of ``owners`` is known full (the next round waits in the queue
        instead of backing off)."""
        return self.queueing is not None and self.queueing.knownFull(owners)

    def demote(self, owners: Sequence[Node]) -> tuple[Sequence[Node], tuple[Node, ...]]:
        """``owners`` split by the node breakers: those to order as usual, then the demoted."""
        if self.queueing is None:
            return owners, ()
        return self.queueing.demote(owners)


def _waitEnded(result: object, trace: IRequestTrace) -> object:
    """A traced queue wait ended: ``dispatched``, or ``left`` (answered ``queue_full`` or
    ``queue_timeout``, or its client gone)."""
    trace.queueWaitEnded("left" if isinstance(result, Failure) else "dispatched")
    return result
