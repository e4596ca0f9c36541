"""The proxy's fair queue of one facade and model (spec §11 "The queue"): pure policy.

Requests wait here (standalone mode) while every owner of their model is known to be full.
One FIFO per client (``flow.clients.Client.key``); the next request comes from the share
that has received the least service, by start-time fair queueing on two levels
(``flow.shares``): first between the declared clients (each its own share, weighted) and
the one *unverified* share every other request belongs to; then, inside the unverified
share, between its keys, where a key never seen joins behind the keys already waiting
(so a key minted per request is no claim to service).  Without declared clients the first
level has one share and the queue is fair between keys.  Every dispatch of the model is
charged (``charge``), also those that never waited, so a client that takes the free slots
first is served last once everybody waits.

A full queue refuses the client with the most waiting, never one with nothing waiting:
an arriving request whose client has fewer waiting than the longest FIFO takes the place
of that FIFO's newest request (as fq_codel and DRR drop from the fattest flow); ties go
against an unverified key before a declared client, then against a key charged at most one
dispatch lately (a key minted per request has its one request's, even when it bounced off a
busy engine and came back), then against the most served.

Everything is bounded: ``maxDepth`` waiting requests, ``MAX_CLIENT_TAGS`` idle tags per
level (the oldest forgotten first), and the drain-rate window ``DRAIN_SAMPLES``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from nvpair.proxy.flow.clients import Client
from nvpair.proxy.flow.shares import IDLE_CREDIT, MAX_IDLE, Shares

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

MAX_CLIENT_TAGS = MAX_IDLE
DRAIN_SAMPLES = 64
DRAIN_WINDOW = 60.0
MAX_RETRY_AFTER = 3600
_UNVERIFIED = ""  # the unverified share's id on the first level (no client key is empty)

T = TypeVar("T")


class Ticket(Generic[T]):
    """One waiting request: its client, when it started waiting and what it carries."""

    __slots__ = ("client", "since", "payload", "waiting")

    def __init__(self, client: Client, since: float, payload: T) -> None:
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

    def perSecond(self, now: float, least: int = 2) -> float | None:
        """Dispatches per second over the recent samples (those within ``DRAIN_WINDOW``),
        or None when fewer than ``least`` (at least two) were seen recently."""
        times = self._times
        while times and now - times[0] > DRAIN_WINDOW:
            times.popleft()
        if len(times) < (least if least > 2 else 2):  # as max(2, least): read per drain
            return None
        last = times[-1]
        span = (last if last > now else now) - times[0]
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
    """Waiting requests of one facade and model: a FIFO per client, least-served share
    first, the longest FIFO refused first when full."""

    def __init__(self, maxDepth: int, charged: Callable[[Client], None] | None = None) -> None:
        self.maxDepth = maxDepth
        self.charged = charged  # told of every dispatch charged (per-client counts)
        self._fifos: dict[str, deque[Ticket[T]]] = {}
        self._top = Shares()  # declared clients and the unverified share
        self._group = Shares(newBehind=True)  # the unverified share's keys
        self._groupKeys = 0  # unverified keys with requests waiting
        self.depth = 0
        self.drain = DrainRate()

    def __len__(self) -> int:
        return self.depth

    def __iter__(self) -> Iterator[Ticket[T]]:
        for fifo in self._fifos.values():
            yield from fifo

    @property
    def virtual(self) -> float:
        """The first level's virtual time."""
        return self._top.virtual

    @property
    def clientsTracked(self) -> int:
        """Shares and keys with service state held (waiting or idle), both levels."""
        return len(self._top) + len(self._group)

    def waitingBy(self) -> dict[str | None, int]:
        """Requests waiting per share (a declared name, or None: the unverified share)."""
        counts: dict[str | None, int] = {}
        for fifo in self._fifos.values():
            share = fifo[0].client.share
            counts[share] = counts.get(share, 0) + len(fifo)
        return counts

    def charge(self, client: Client) -> None:
        """``client`` was dispatched a request of this model: one unit of service, on both
        levels (a declared client's ``1 / weight``)."""
        if client.share is None:
            self._top.charge(_UNVERIFIED)
            self._group.charge(client.key)
        else:
            self._top.charge(client.key, client.weight)
        if self.charged is not None:
            self.charged(client)

    def push(self, ticket: Ticket[T]) -> Ticket[T] | None:
        """Queue ``ticket`` at the end of its client's FIFO.  Returns the ticket left out:
        None; ``ticket`` itself when the queue is full and its client has the most waiting;
        or the newest request of the longest FIFO, whose place it took (out of the queue)."""
        left: Ticket[T] | None = None
        if self.depth >= self.maxDepth:
            left = self._victim(ticket.client)
            if left is None:
                return ticket
            self.remove(left)
        client = ticket.client
        fifo = self._fifos.get(client.key)
        if fifo is None:
            fifo = self._fifos[client.key] = deque()
            if client.share is None:
                self._group.waiting(client.key)
                self._groupKeys += 1
                self._top.waiting(_UNVERIFIED)
            else:
                self._top.waiting(client.key)
        fifo.append(ticket)
        self.depth += 1
        return left

    def _rank(self, client: Client, waiting: int) -> tuple[int, int, int, float]:
        """Who is refused first: the most waiting; then an unverified key before a declared
        client; then a key charged at most one dispatch lately (one minted per request)
        before one charged more; then the most served (the largest tag)."""
        if client.share is None:
            group = self._group
            return waiting, 1, not group.regular(client.key), group.tag(client.key)
        return waiting, 0, 0, self._top.tag(client.key)

    def _victim(self, arriving: Client) -> Ticket[T] | None:
        """The newest request of the FIFO that gives way to ``arriving``'s, or None when
        ``arriving``'s client, with its new request, ranks first itself (never when it has
        nothing waiting: then the first-ranked other FIFO gives way)."""
        own = self._fifos.get(arriving.key)
        # A client with nothing waiting always gets a place: any other waiting FIFO gives way.
        best = self._rank(arriving, len(own) + 1) if own else (0, 0, 0, -math.inf)
        victim: deque[Ticket[T]] | None = None
        for key, fifo in self._fifos.items():
            if key == arriving.key:
                continue
            rank = self._rank(fifo[0].client, len(fifo))
            if rank > best:
                best, victim = rank, fifo
        return None if victim is None else victim[-1]

    def shed(self) -> Ticket[T] | None:
        """Give up one waiting request to shrink the queue: the newest of the FIFO that
        ranks first (``_rank``), taken out; None when nothing waits."""
        victim: deque[Ticket[T]] | None = None
        best: tuple[int, int, int, float] | None = None
        for fifo in self._fifos.values():
            rank = self._rank(fifo[0].client, len(fifo))
            if best is None or rank > best:
                best, victim = rank, fifo
        if victim is None:
            return None
        ticket = victim[-1]
        self.remove(ticket)
        return ticket

    def pop(self, now: float) -> Ticket[T] | None:
        """Take the next request: the head of the least-served share (inside the unverified
        share, of its least-served key); ties go to the one waiting longest.  Charges that
        client and records the dispatch."""
        best: str | None = None
        bestKey = (math.inf, math.inf)
        group: str | None = None
        groupKey = (math.inf, math.inf)
        for key, fifo in self._fifos.items():
            head = fifo[0]
            if head.client.share is None:
                rank = (self._group.active[key], head.since)
                if rank < groupKey:
                    group, groupKey = key, rank
            else:
                rank = (self._top.active[key], head.since)
                if rank < bestKey:
                    best, bestKey = key, rank
        if group is not None and (self._top.active[_UNVERIFIED], groupKey[1]) < bestKey:
            best = group
        if best is None:
            return None
        ticket = self._take(best)
        self.charge(ticket.client)
        self.drain.dispatched(now)
        return ticket

    def remove(self, ticket: Ticket[T]) -> bool:
        """Take ``ticket`` out (its client left, it timed out, or another took its place);
        False if not waiting."""
        if not ticket.waiting:
            return False
        fifo = self._fifos.get(ticket.client.key)
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

    def _take(self, key: str) -> Ticket[T]:
        fifo = self._fifos[key]
        ticket = fifo.popleft()
        ticket.waiting = False
        self.depth -= 1
        if not fifo:
            self._idle(ticket.client)
        return ticket

    def _idle(self, client: Client) -> None:
        del self._fifos[client.key]
        if client.share is None:
            self._group.idle(client.key)
            self._groupKeys -= 1
            if not self._groupKeys:
                self._top.idle(_UNVERIFIED)
        else:
            self._top.idle(client.key)

    def oldestSince(self) -> float:
        """When the longest-waiting request started waiting (infinity when none waits)."""
        return min((fifo[0].since for fifo in self._fifos.values()), default=math.inf)

    def oldestWait(self, now: float) -> float:
        """Seconds the longest-waiting request has waited (0 when none waits)."""
        return max(0.0, now - self.oldestSince())
