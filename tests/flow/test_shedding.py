"""Admission by predicted wait over one queue (spec §11 "The queue"): the drain rate from
the owners' service, the bound it gives, the requests shed when they could not start in
time, and the ``Retry-After`` of a refusal."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.flow.clients import Client
from nvpair.proxy.flow.fairqueue import FairQueue, Ticket
from nvpair.proxy.flow.shedding import Shedding
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.fakecontext import makeSettings

OWNERS = (Node("A", False, ("A",), frozenset({"m"})),)


class FixedService:
    """Every node: ``capacity`` slots, each held ``seconds`` (two requests seen), if known."""

    def __init__(self, capacity: int | None = None, seconds: float | None = None) -> None:
        self.slots = capacity
        self.seconds = seconds

    def capacity(self, nodeId: str) -> int | None:
        return self.slots

    def serviceTime(self, nodeId: str) -> float | None:
        return self.seconds

    def serviceSamples(self, nodeId: str) -> int:
        return 2 if self.seconds is not None else 0

    def serviceAtLeast(self, nodeId: str) -> float | None:
        return None


class SheddingTests(SynchronousTestCase):
    """A queue's bound and refusals follow the rate its owners serve at."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000.0)
        self.settings = makeSettings(queueMax=64, queueTimeout=10.0, retryAfter=7)
        self.queue: FairQueue[str] = FairQueue(64)

    def shedding(self, service: FixedService) -> Shedding:
        return Shedding(self.settings, self.clock, service)

    def wait(self, count: int, client: str = "c") -> None:
        for i in range(count):
            self.assertIsNone(self.queue.push(Ticket(Client(client), self.clock.seconds(), f"{i}")))

    def test_unknownRate(self) -> None:
        """Nothing known of the owners: no rate, the bound is ``--queue-max``, nothing is
        shed, and a refusal says ``--retry-after`` (the fallback, as where there is no queue)."""
        shedding = self.shedding(FixedService())
        self.wait(20)
        self.assertIsNone(shedding.drainRate(self.queue, lambda: OWNERS))
        self.assertEqual(shedding.bound(None), 64)
        shedding.shed(self.queue, lambda: OWNERS, self.fail)
        self.assertEqual(len(self.queue), 20)
        self.assertEqual(shedding.retryAfter(self.queue, lambda: OWNERS), 7)
        self.assertEqual(shedding.fallback, 7)

    def test_rateFromTheOwners(self) -> None:
        """Two slots each held a second: two a second; five waiting are let out in three
        whole seconds (``Retry-After``); the bound is what starts before a new request's
        ten seconds run out, itself among them (``ceil(rate * timeout) - 1``)."""
        shedding = self.shedding(FixedService(2, 1.0))
        self.wait(5)
        self.assertEqual(shedding.drainRate(self.queue, lambda: OWNERS), 2.0)
        self.assertEqual(shedding.retryAfter(self.queue, lambda: OWNERS), 3)
        self.assertEqual(shedding.bound(2.0), 19)

    def test_observedRateFirst(self) -> None:
        """Once the queue has let out enough, its own rate counts: the owners are not asked."""
        shedding = self.shedding(FixedService(2, 1.0))
        self.wait(12)
        for _ in range(10):
            self.clock.advance(0.25)
            self.assertIsNotNone(self.queue.pop(self.clock.seconds()))
        rate = shedding.drainRate(self.queue, lambda: self.fail("owners asked"))
        assert rate is not None
        self.assertAlmostEqual(rate, 4.0, delta=0.5)

    def test_shedWhatCannotStartInTime(self) -> None:
        """One a second and ten seconds each: of fifteen waiting since now, the *k*-th
        starts *k* seconds from now, so nine start in time; six are taken out and refused,
        each while the bound is the nine that stay (its ``Retry-After``); the bound is the
        rate's again after."""
        shedding = self.shedding(FixedService(1, 1.0))
        self.wait(15)
        seen: list[tuple[str, int]] = []

        def refuse(ticket: Ticket[str]) -> None:
            seen.append((ticket.payload, self.queue.maxDepth))

        shedding.shed(self.queue, lambda: OWNERS, refuse)
        self.assertEqual(len(self.queue), 9)
        self.assertEqual(len(seen), 6)
        self.assertEqual({depth for _, depth in seen}, {9})
        self.assertNotIn(seen[0][0], [ticket.payload for ticket in self.queue])
        self.assertEqual(self.queue.maxDepth, shedding.bound(1.0))
        self.assertEqual(shedding.retryAfter(self.queue, lambda: OWNERS), 9)
