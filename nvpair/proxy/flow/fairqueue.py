"""The proxy's fair queue of one facade and model (spec §11 "The queue"): pure policy.

Requests wait here (standalone mode) while every owner of their model is known to be full.
One FIFO per client; the next request comes from the waiting client that has received the
least service, by start-time fair queueing: each client carries a virtual finish tag, a
dispatch advances its client's tag by one, and a client that starts waiting again resumes
at ``max(its tag, the queue's virtual time - IDLE_CREDIT)``: idle time banks at most one
request's credit, so a client sending one request at a time (idle while it is served) goes
before a backlogged one it has not out-served, and a long-idle one cannot take a run.  Every
dispatch of the model is charged (``charge``), also those that never waited, so a client
that takes the free slots first is served last once everybody waits.

Everything is bounded: ``maxDepth`` waiting requests, ``MAX_CLIENT_TAGS`` idle clients'
tags (the oldest forgotten first: a forgotten tag is the virtual time anyway, once nothing
of that client waits), and the drain-rate window ``DRAIN_SAMPLES``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = [
    "DRAIN_SAMPLES",
    "DRAIN_WINDOW",
    "MAX_CLIENT_TAGS",
    "MAX_RETRY_AFTER",
    "IDLE_CREDIT",
    "DrainRate",
    "FairQueue",
    "Ticket",
]

MAX_CLIENT_TAGS = 1024
IDLE_CREDIT = 1.0
DRAIN_SAMPLES = 64
DRAIN_WINDOW = 60.0
MAX_RETRY_AFTER = 3600

T = TypeVar("T")


class Ticket(Generic[T]):
    """One waiting request: its client key, when it started waiting and what it carries."""

    __slots__ = ("client", "since", "payload", "waiting")

    def __init__(self, client: str, since: float, payload: T) -> None:
        self.client = client
        self.since = since
        self.payload = payload
        self.waiting = True


class DrainRate:
    """How fast a queue has been emptying: the last ``DRAIN_SAMPLES`` dispatch times."""

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=DRAIN_SAMPLES)

    def dispatched(self, now: float) -> None:
        """Record one dispatch out of the queue."""
        self._times.append(now)

    def perSecond(self, now: float) -> float | None:
        """Dispatches per second over the recent samples (those within ``DRAIN_WINDOW``),
        or None when fewer than two were seen recently."""
        times = self._times
        while times and now - times[0] > DRAIN_WINDOW:
            times.popleft()
        if len(times) < 2:
            return None
        span = max(now, times[-1]) - times[0]
        if span <= 0:
            return None
        return (len(times) - 1) / span

    def retryAfter(self, ahead: int, now: float, fallback: int) -> int:
        """Whole seconds until ``ahead`` more dispatches are expected (at least 1); the
        ``fallback`` (at least 1) when no rate was observed."""
        rate = self.perSecond(now)
        if rate is None:
            return max(1, fallback)
        return max(1, min(MAX_RETRY_AFTER, math.ceil(max(ahead, 1) / rate)))


class FairQueue(Generic[T]):
    """Waiting requests of one facade and model: a FIFO per client, least-served first."""

    def __init__(self, maxDepth: int) -> None:
        self.maxDepth = maxDepth
        self._fifos: dict[str, deque[Ticket[T]]] = {}
        self._tags: OrderedDict[str, float] = OrderedDict()  # idle clients, oldest first
        self._active: dict[str, float] = {}  # waiting clients' tags
        self.virtual = 0.0
        self.depth = 0
        self.drain = DrainRate()

    def __len__(self) -> int:
        return self.depth

    def __iter__(self) -> Iterator[Ticket[T]]:
        for fifo in self._fifos.values():
            yield from fifo

    @property
    def clientsTracked(self) -> int:
        """Clients with service state held (waiting or idle)."""
        return len(self._tags) + len(self._active)

    def _tag(self, client: str) -> float:
        tag = self._active.get(client)
        if tag is None:
            tag = self._tags.get(client, self.virtual)
        return max(tag, self.virtual - IDLE_CREDIT)

    def charge(self, client: str) -> None:
        """``client`` was dispatched a request of this model: one unit of service (the
        queue's virtual time moves to that request's start tag)."""
        start = self._tag(client)
        self.virtual = max(self.virtual, start)
        tag = start + 1.0
        if client in self._active:
            self._active[client] = tag
            return
        self._tags[client] = tag
        self._tags.move_to_end(client)
        while len(self._tags) > MAX_CLIENT_TAGS:
            self._tags.popitem(last=False)

    def push(self, ticket: Ticket[T]) -> bool:
        """Queue ``ticket`` at the end of its client's FIFO; False when the queue is full."""
        if self.depth >= self.maxDepth:
            return False
        client = ticket.client
        fifo = self._fifos.get(client)
        if fifo is None:
            fifo = self._fifos[client] = deque()
            self._active[client] = self._tag(client)
            self._tags.pop(client, None)
        fifo.append(ticket)
        self.depth += 1
        return True

    def pop(self, now: float) -> Ticket[T] | None:
        """Take the next request: the head of the least-served waiting client's FIFO (ties:
        the one waiting longest); charges that client and records the dispatch."""
        best: str | None = None
        bestKey = (math.inf, math.inf)
        for client, fifo in self._fifos.items():
            key = (self._active[client], fifo[0].since)
            if key < bestKey:
                best, bestKey = client, key
        if best is None:
            return None
        ticket = self._take(best)
        self.charge(best)
        self.drain.dispatched(now)
        return ticket

    def remove(self, ticket: Ticket[T]) -> bool:
        """Take ``ticket`` out (its client left, or it timed out); False if not waiting."""
        if not ticket.waiting:
            return False
        fifo = self._fifos.get(ticket.client)
        if fifo is None:
            return False
        try:
            fifo.remove(ticket)
        except ValueError:
            return False
        ticket.waiting = False
        self.depth -= 1
        if not fifo:
            self._idle(ticket.client)
        return True

    def _take(self, client: str) -> Ticket[T]:
        fifo = self._fifos[client]
        ticket = fifo.popleft()
        ticket.waiting = False
        self.depth -= 1
        if not fifo:
            self._idle(client)
        return ticket

    def _idle(self, client: str) -> None:
        del self._fifos[client]
        self._tags[client] = self._active.pop(client)
        self._tags.move_to_end(client)
        while len(self._tags) > MAX_CLIENT_TAGS:
            self._tags.popitem(last=False)

    def oldestWait(self, now: float) -> float:
        """Seconds the longest-waiting request has waited (0 when none waits)."""
        oldest = min((fifo[0].since for fifo in self._fifos.values()), default=now)
        return max(0.0, now - oldest)
