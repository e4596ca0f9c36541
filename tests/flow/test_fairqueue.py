"""The fair queue's policy: least-served client first, FIFO per client, bounds and the drain
rate (spec §11 "The queue"); declared shares, the unverified share and the full queue's
refusals are in ``test_shares``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.flow.clients import Client
from nvpair.proxy.flow.fairqueue import (
    DRAIN_SAMPLES,
    DRAIN_WINDOW,
    MAX_CLIENT_TAGS,
    DrainRate,
    FairQueue,
    Ticket,
)


def _push(queue: FairQueue[str], client: str, since: float, name: str) -> Ticket[str]:
    ticket = Ticket(Client(client), since, name)
    assert queue.push(ticket) is None
    return ticket


def _drainAll(queue: FairQueue[str], now: float = 0.0) -> list[str]:
    out: list[str] = []
    while True:
        ticket = queue.pop(now)
        if ticket is None:
            return out
        out.append(ticket.payload)


class OrderTests(SynchronousTestCase):
    """Which waiting request goes next."""

    def test_fifoWithinClient(self) -> None:
        """One client's requests leave in the order they came."""
        queue: FairQueue[str] = FairQueue(10)
        for i in range(4):
            _push(queue, "a", i, f"a{i}")
        self.assertEqual(_drainAll(queue), ["a0", "a1", "a2", "a3"])

    def test_leastServedFirst(self) -> None:
        """A heavy client's backlog does not keep a light client waiting: its one request
        goes next, although it came last."""
        queue: FairQueue[str] = FairQueue(20)
        queue.charge(Client("light"))  # seen before: a never-seen key joins behind
        for i in range(10):
            _push(queue, "heavy", i, f"h{i}")
        queue.pop(10)
        queue.pop(10)  # heavy has been served twice, light once
        _push(queue, "light", 11, "l0")
        self.assertEqual(queue.pop(12).payload, "l0")  # type: ignore[union-attr]

    def test_chargedDispatchesCount(self) -> None:
        """Dispatches that never waited count as service: the client that took the free
        slots is served after those that had nothing."""
        queue: FairQueue[str] = FairQueue(20)
        queue.charge(Client("light"))  # both seen before (a never-seen key joins behind)
        queue.charge(Client("heavy"))
        queue.charge(Client("heavy"))
        queue.charge(Client("heavy"))
        _push(queue, "heavy", 0, "h")
        _push(queue, "light", 1, "l")
        self.assertEqual(_drainAll(queue), ["l", "h"])

    def test_idleBanksNoCredit(self) -> None:
        """A client idle while others were served resumes at most one request behind the
        queue's virtual time: no run of its own afterwards (not a banked backlog)."""
        queue: FairQueue[str] = FairQueue(50)
        for i in range(10):
            _push(queue, "a", i, f"a{i}")
        _drainAll(queue)
        for i in range(3):
            _push(queue, "b", 20 + i, f"b{i}")
            _push(queue, "a", 20 + i, f"a{10 + i}")
        # b was never served, but may only get one request of credit, then alternate.
        self.assertEqual(_drainAll(queue), ["b0", "a10", "b1", "a11", "b2", "a12"])

    def test_interleavesEqualClients(self) -> None:
        """Equally served clients alternate, the longest waiting first on a tie."""
        queue: FairQueue[str] = FairQueue(10)
        queue.charge(Client("a"))
        queue.charge(Client("b"))
        _push(queue, "a", 0, "a0")
        _push(queue, "a", 1, "a1")
        _push(queue, "b", 2, "b0")
        _push(queue, "b", 3, "b1")
        self.assertEqual(_drainAll(queue), ["a0", "b0", "a1", "b1"])

    @given(st.lists(st.tuples(st.sampled_from("abcd"), st.booleans()), max_size=80))
    def test_invariants(self, ops: list[tuple[str, bool]]) -> None:
        """Whatever the pushes and pops: depth is what waits, never over the bound, each
        client's requests leave in order, and every request leaves once (dispatched, or
        left out by a full queue)."""
        queue: FairQueue[str] = FairQueue(8)
        pushed: dict[str, list[str]] = {}
        popped: list[str] = []
        dropped: list[str] = []
        for n, (client, push) in enumerate(ops):
            if push:
                name = f"{client}{n}"
                left = queue.push(Ticket(Client(client), n, name))
                if left is not None:
                    dropped.append(left.payload)
                pushed.setdefault(client, []).append(name)
            else:
                ticket = queue.pop(n)
                if ticket is not None:
                    popped.append(ticket.payload)
            self.assertLessEqual(len(queue), 8)
            self.assertEqual(len(queue), len(list(queue)))
        popped.extend(_drainAll(queue))
        self.assertEqual(sorted(popped + dropped), sorted(x for v in pushed.values() for x in v))
        self.assertEqual(len(set(popped + dropped)), len(popped + dropped))
        for client, names in pushed.items():
            kept = [n for n in names if n not in dropped]
            self.assertEqual([p for p in popped if p.startswith(client)], kept)


class BoundTests(SynchronousTestCase):
    """The queue and its service state stay bounded."""

    def test_fullRefuses(self) -> None:
        """Past ``maxDepth`` a push of the client with the most waiting is refused and
        nothing is held for it, however many come."""
        queue: FairQueue[str] = FairQueue(3)
        for i in range(3):
            _push(queue, "c", i, str(i))
        for i in range(100):
            over = Ticket(Client("c"), 10 + i, "over")
            self.assertIs(queue.push(over), over)
        self.assertEqual(len(queue), 3)
        self.assertNotIn("over", [t.payload for t in queue])

    def test_clientTagsBounded(self) -> None:
        """Service state of idle clients is bounded (the oldest forgotten first)."""
        queue: FairQueue[str] = FairQueue(4)
        for i in range(MAX_CLIENT_TAGS * 3):
            queue.charge(Client(f"client{i}"))
            queue.charge(Client(f"d:name{i}", f"name{i}"))
        # Per level: the unverified share's keys, and the shares (with the unverified one).
        self.assertEqual(queue.clientsTracked, 2 * MAX_CLIENT_TAGS)

    def test_removeLeavesAtOnce(self) -> None:
        """A removed request is gone (its client's next one moves up), only once."""
        queue: FairQueue[str] = FairQueue(4)
        first = _push(queue, "a", 0, "a0")
        _push(queue, "a", 1, "a1")
        self.assertTrue(queue.remove(first))
        self.assertFalse(queue.remove(first))
        self.assertEqual(_drainAll(queue), ["a1"])
        self.assertEqual(queue.oldestWait(5), 0.0)


class DrainRateTests(SynchronousTestCase):
    """Retry-After from the rate the queue has actually drained at."""

    def test_noRateFallsBack(self) -> None:
        """Before two dispatches there is no rate: the fallback, at least 1."""
        rate = DrainRate()
        self.assertEqual(rate.retryAfter(10, 0, 7), 7)
        self.assertEqual(rate.retryAfter(10, 0, 0), 1)

    def test_fromObservedRate(self) -> None:
        """Two dispatches a second and 10 ahead: 5 s; whole seconds, at least 1."""
        rate = DrainRate()
        for i in range(11):
            rate.dispatched(i * 0.5)
        self.assertEqual(rate.retryAfter(10, 5.0, 99), 5)
        self.assertEqual(rate.retryAfter(1, 5.0, 99), 1)
        self.assertEqual(rate.retryAfter(3, 5.0, 99), 2)

    def test_oldSamplesForgotten(self) -> None:
        """Dispatches older than the window say nothing of today's rate; samples bounded."""
        rate = DrainRate()
        for i in range(DRAIN_SAMPLES * 2):
            rate.dispatched(i * 0.01)
        self.assertIsNotNone(rate.perSecond(1.0))
        self.assertIsNone(rate.perSecond(DRAIN_WINDOW + 10))
