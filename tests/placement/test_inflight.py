"""Placement against requests still in flight: a miss behind a prompt its engine has not
read yet confirms nothing, and a full holder about to free a slot is held for."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.placement.affinity import MAX_UNREAD, requestServed
from nvpair.proxy.placement.choose import RECOMPUTE_SECONDS, Hold, Placed, recomputeSeconds
from nvpair.proxy.placement.keys import AffinityKey
from tests.support.cases.placementfleet import NODES, Fleet, request, tenantPrompt


def served(fleet: Fleet, key: AffinityKey, nodeId: str, cached: int) -> None:
    """``nodeId`` ends ``key``'s request reporting ``cached`` of 500 prompt tokens."""
    assert fleet.states is not None
    exchange = SimpleNamespace(
        committedStatus=200,
        servedBy=nodeId,
        workload=SimpleNamespace(stats={"promptTokens": 500, "cachedTokens": cached}),
        prefixKey=key,
    )
    requestServed(exchange, fleet.states, fleet.affinity)


class UnreadTests(SynchronousTestCase):
    """What a request still in flight recorded is not yet in its engine's cache."""

    def test_missBehindUnreadConfirmsNothing(self) -> None:
        """Tenant 1's first request is placed and not yet committed; a second user of
        tenant 1 follows it there and its engine reports nothing cached: no entry of the
        node (tenant 2's family among them) is dropped and no miss is counted.  Once the
        first has committed, the same answer is a confirmed miss."""
        fleet = Fleet()
        affinity = fleet.affinity
        fleet.place(request(tenantPrompt(2), "q"))
        first = request(tenantPrompt(1), "first " * 60)
        home, _ = fleet.place(first, serve=False)
        fleet.place(request(tenantPrompt(3), "q"))
        fleet.place(request(tenantPrompt(4), "q"))
        fleet.place(request(tenantPrompt(5), "q"))  # a second family on the first node
        families = affinity.index.roots(home)
        second = request(tenantPrompt(1), "second " * 60)
        self.assertEqual(fleet.place(second)[0], home)
        self.assertIsNone(second.expect)
        served(fleet, second, home, cached=0)
        self.assertEqual((affinity.index.dropped, affinity.expectedMisses), (0, 0))
        self.assertEqual(affinity.index.roots(home), families)
        affinity.served(first, home)
        third = request(tenantPrompt(1), "third " * 60)
        self.assertEqual(fleet.place(third)[0], home)
        self.assertIsNotNone(third.expect)
        served(fleet, third, home, cached=0)
        self.assertEqual(affinity.expectedMisses, 1)
        self.assertGreater(affinity.index.dropped, 0)

    def test_unreadBounded(self) -> None:
        """Placements that never commit are remembered at most ``MAX_UNREAD`` times."""
        fleet = Fleet()
        for n in range(MAX_UNREAD + 10):
            fleet.place(request(tenantPrompt(n % 7), f"user {n}"), serve=False)
        self.assertEqual(len(fleet.affinity.unread), MAX_UNREAD)


class SoonFreeTests(SynchronousTestCase):
    """A full holder whose slot frees sooner than recomputing elsewhere is held for."""

    def test_heldWhenASlotFreesSooner(self) -> None:
        """An 800-character prefix (0.2 s to recompute, under ``RECOMPUTE_SECONDS``) whose
        holder is full of ours: while how long ours hold a slot there is unknown the request
        moves at once; once ours are seen to hold one 0.1 s (two slots: one frees in about
        0.05 s) it is held for the holder, at most as long as recomputing; a holder whose
        slots free more slowly than recomputing is left at once."""
        short = "Be brief. " * 80
        cost = recomputeSeconds(len(short), None)
        self.assertLess(cost, RECOMPUTE_SECONDS)
        for service, held in ((None, False), (0.1, True), (4 * cost, False)):
            fleet = Fleet()
            assert fleet.ledger is not None
            home, _ = fleet.place(request(short, "x"))
            fleet.ours[home] = 2
            for node in NODES:
                fleet.report(node.id, busy=2 if node.id == home else 0)
            if service is not None:
                fleet.ledger.finished(home, service)
            placed, result = fleet.place(request(short, "y"), hold=Hold.ALLOWED, serve=False)
            self.assertEqual(placed == home, held, service)
            self.assertIs(result, None if held else Placed.OVERRIDDEN)
            if held:
                assert fleet.choice is not None
                self.assertAlmostEqual(fleet.choice.hold or 0.0, cost, places=3)
