"""Placement that counts loads (spec §11, "Placement that counts loads"): the model that
leads the fleet's demand per copy gets the free room for its second copy sooner; pure, on a
``Clock``."""

from __future__ import annotations

from nvpair.proxy.placement.interfaces import LoadPlan
from nvpair.proxy.placement.loads import LEAD, LEAD_WAIT, ROOM_WAIT
from tests.placement.loadskit import A, B, C, SpillCase


class LeadTests(SpillCase):
    """m warm on A and full, B with room: m leads while x is not in as much demand."""

    def test_leaderTakesRoomSooner(self) -> None:
        """A model with one copy whose demand per copy with one more leads every other
        model's by ``LEAD`` takes free room once its queue waited ``LEAD_WAIT`` of a load
        (bin-packing gives the most popular model its second copy first); one that does not
        lead waits ``ROOM_WAIT`` of a load, and the leader waits while a copy loads."""
        soon = LEAD_WAIT * 10 + 0.1  # the default load: 10 s
        self.assertEqual(self.plan(waited=soon - 0.2), LoadPlan((A,)))
        self.assertEqual(self.plan(waited=soon), LoadPlan((B,), B))
        self.rival()  # x: 2 a minute, 1 per copy with one more; m: 1 per copy with one more
        self.assertEqual(self.plan(waited=soon), LoadPlan((A,)))
        self.start("A", "m", 1)  # m: 3 a minute, 1.5 per copy with one more: 1.5 × x's
        self.assertGreater(self.residency.demand("m") / 2, LEAD * self.residency.neediest("m"))
        self.assertEqual(self.plan(waited=soon), LoadPlan((B,), B))
        self.residency.loadStarted("B", "m")
        self.assertEqual(self.plan(waited=soon), LoadPlan((A, B)))

    def test_leaderNeverEvicts(self) -> None:
        """Leading counts in free room only: where a copy would evict, a whole load."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.assertEqual(self.plan(waited=9.5, owners=(A, C)), LoadPlan((A,)))

    def test_leaderThirdCopyWaits(self) -> None:
        """Leading counts for a second copy only: with two, a third into free room waits
        ``ROOM_WAIT`` of a load per copy (demand above one node's capacity makes exactly
        one more copy)."""
        self.hold(C=("m",))
        self.serve("C", 2, 1.0)
        self.start("C", "m", 2)
        self.assertEqual(self.plan(waited=ROOM_WAIT * 10), LoadPlan((A, C)))
