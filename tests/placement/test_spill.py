"""Placement that counts loads, rule 2 (spec §11): the warm copies all full, a further
copy only when their queue outlasts a load elsewhere, and only where one may go."""

from __future__ import annotations

from nvpair.proxy.placement.interfaces import LoadPlan
from nvpair.proxy.placement.loads import GIVE_WAY, SHARE_MARGIN, SPILL_WAIT, Tier
from tests.support.cases.loadplan import A, B, C, PlanCase


class SpillTests(PlanCase):
    """Warm copies all full: a further copy only when their wait exceeds a load elsewhere."""

    def setUp(self) -> None:
        super().setUp()
        self.learnCapacity("B", ("x", "y"))
        self.hold(A=("m",), B=("x",), C=())
        self.serve("A", 2, 1.0)  # two slots, a second each: two requests a second
        self.start("A", "m", 2)

    def test_waitShorterThanALoad(self) -> None:
        """Predicted wait ((ahead + 1) / 2 per second) under the 10 s default load: the warm
        owners only (the request waits for them in the proxy)."""
        self.assertEqual(self.plan(ahead=18), LoadPlan((A,)))

    def test_waitLongerThanALoad(self) -> None:
        """Past it: the cheapest cold owner alone (B has room), where the request loads."""
        self.assertEqual(self.plan(ahead=20), LoadPlan((B,), B))

    def test_oneCopyAtATime(self) -> None:
        """While that copy loads it counts at the warm copies' rate: another load only once
        the wait beyond both exceeds a load."""
        self.residency.loadStarted("B", "m")
        self.assertEqual(self.plan(ahead=38), LoadPlan((A, B)))
        self.assertEqual(self.plan(ahead=40), LoadPlan((C,), C))

    def test_waitedLongerThanALoad(self) -> None:
        """What the model's requests waited lately past a load's seconds times the copies
        times ``SPILL_WAIT``: a further copy, however short the queue now; not while a
        copy loads."""
        self.assertEqual(self.plan(waited=SPILL_WAIT * 10 - 0.1), LoadPlan((A,)))
        self.assertEqual(self.plan(waited=SPILL_WAIT * 10 + 0.1), LoadPlan((B,), B))
        self.residency.loadStarted("B", "m")
        self.assertEqual(self.plan(waited=1000.0), LoadPlan((A, B)))

    def test_roomForTheNeediest(self) -> None:
        """Free room goes to the model bin-packing would give it: not to this one while a
        resident model's demand per copy with one more exceeds this one's by
        ``GIVE_WAY``, the margin a copy gives way at (x: 10 a minute, 5 with one more copy;
        m: 2, 1 with one more; then 7, 3.5, still refused, where ``SHARE_MARGIN`` let the
        less needy model take the last free room, and the neediest's copy had to evict it
        later; then 8, 4)."""
        self.use("B", "x", 10)
        self.assertEqual(self.residency.neediest(), 5.0)
        self.assertEqual(self.plan(ahead=1000, waited=1000.0), LoadPlan((A,)))
        self.start("A", "m", 5)  # m: 7 a minute, 3.5 per copy with one more
        self.assertLess(3.5 * GIVE_WAY, 5.0)
        self.assertLess(5.0, 3.5 * SHARE_MARGIN)
        self.assertEqual(self.plan(waited=1000.0), LoadPlan((A,)))
        self.start("A", "m", 1)  # m: 8 a minute, 4 per copy with one more
        self.assertEqual(self.plan(waited=1000.0), LoadPlan((B,), B))

    def test_sameWaitWhereverItGoes(self) -> None:
        """Where the copy would evict (an idle copy of x, resident on A too), or take the
        place of an only copy that moves into room elsewhere (y, while B has room), the
        same ``SPILL_WAIT`` of a load's seconds waited as into free room: what may be
        evicted is the demand rule's to say, and each costs one load."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.assertEqual(self.planner.cheapest((C,), "m").tier, Tier.COPY)
        self.assertEqual(self.plan(waited=SPILL_WAIT * 10 - 0.1, owners=(A, C)), LoadPlan((A,)))
        self.assertEqual(self.plan(waited=SPILL_WAIT * 10 + 0.1, owners=(A, C)), LoadPlan((C,), C))
        self.hold(A=("m",), C=("y",))
        self.assertEqual(self.planner.cheapest((C,), "m").tier, Tier.ONLY)
        self.assertTrue(self.residency.roomElsewhere("C"))
        self.assertEqual(self.plan(waited=SPILL_WAIT * 10 - 0.1, owners=(A, C)), LoadPlan((A,)))
        self.assertEqual(self.plan(waited=SPILL_WAIT * 10 + 0.1, owners=(A, C)), LoadPlan((C,), C))

    def test_unknownRateStaysWarm(self) -> None:
        """A warm copy whose service time is not known yet: no spill for the queue's length,
        however long (stay warm when uncertain); what was waited still counts."""
        self.ledger.forget("A")
        self.ledger.configure("A", 2)
        self.assertEqual(self.plan(ahead=1000), LoadPlan((A,)))
        self.assertEqual(self.plan(ahead=1000, waited=11.0), LoadPlan((B,), B))

    def test_notKnownFull(self) -> None:
        """A node never seen evicting takes a further copy only while it holds fewer models
        than another owner was seen holding (B, full, was seen holding two); holding as
        many, a load there is taken to evict (an idle copy of x or y, resident on the other
        too, not used lately: the same wait)."""
        self.hold(B=("x", "y"), C=("x",))
        self.assertEqual(self.planner.cheapest((B, C), "m").tier, Tier.UNKNOWN)
        self.assertEqual(self.plan(waited=11.0), LoadPlan((C,), C))
        self.hold(C=("x", "y"))
        self.assertEqual(self.planner.cheapest((B, C), "m").tier, Tier.COPY)
        self.assertEqual(self.plan(waited=2.4), LoadPlan((A,)))
        self.assertIn(self.plan(waited=2.6).load, (B, C))

    def test_neverEvictAnOnlyCopy(self) -> None:
        """With no room on any other node, a further copy never pushes out the only copy of
        a model, used lately or not, idle or busy."""
        self.hold(A=("m", "z"), B=("x", "z"))
        self.learnCapacity("C", ("y",))
        self.hold(C=("y",))
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))
        self.begin("C", "y")
        self.residency.ended("C", "y")
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))
        self.start("C", "y", 1)
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))

    def test_copyGivesWayByDemandPerCopy(self) -> None:
        """A copy of a model resident elsewhere makes room when it was not used on that
        node lately, or when its model's demand per copy is under 1 / ``SHARE_MARGIN`` of
        this model's per copy with one more (bin-packing by popularity's order); else it
        stays."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.assertEqual(self.planner.cheapest((C,), "m").tier, Tier.COPY)
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((C,), C))
        self.begin("C", "x")  # x: 1 a minute over 2 copies; m: 2 over 2
        self.residency.ended("C", "x")
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((C,), C))
        for _ in range(3):  # x: 4 a minute over 2 copies
            self.begin("C", "x")
            self.residency.ended("C", "x")
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((A,)))

    def test_furtherCopyGivesWayAtGiveWay(self) -> None:
        """A copy of a model that keeps another gives way at the smaller margin,
        ``GIVE_WAY``: the most popular model's second copy takes the place of the second
        copy the next one took early on (its demand then looked even), as soon as its
        demand per copy with one more is ``GIVE_WAY`` times the other's, not
        ``SHARE_MARGIN`` times (x: 11 a minute over three copies, on A, B and C; m: 10, 5
        each with one more; at 13 a minute x stays)."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.start("A", "m", 8)
        self.use("C", "x", 11)
        self.assertLess(11 / 3 * GIVE_WAY, 5.0)
        self.assertLess(5.0, 11 / 3 * SHARE_MARGIN)
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((C,), C))
        self.use("C", "x", 2)
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((A,)))

    def test_onlyCopyMovesToRoom(self) -> None:
        """With room on another node (B holds one of two), the only copy of a model whose
        demand is under 1 / ``SHARE_MARGIN`` of this one's per copy with one more gives way
        (its next request loads it there): the popular model's second copy is not left
        without a place because the room was beside its first; a popular one stays."""
        self.learnCapacity("C", ("y",))
        self.hold(C=("y",))
        for _ in range(4):  # m: 6 a minute, 3 per copy with one more
            self.begin("A", "m")
            self.residency.ended("A", "m")
        self.start("C", "y", 1)  # y: 1 a minute, one copy
        self.assertTrue(self.residency.roomElsewhere("C"))
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((C,), C))
        self.start("C", "y", 2)  # y: 3 a minute
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))

    def test_moveLeavesRoomToTheNeediest(self) -> None:
        """An only copy moves into room elsewhere only while that room is not for a model
        more in need, as free room is not: a less popular model's second copy does not
        move y into the room on B that x's second copy needs (x: 10 a minute, 5 per copy
        with one more; m: 2, 1 with one more; then 8, 4)."""
        self.learnCapacity("C", ("y",))
        self.hold(C=("y",))
        self.use("B", "x", 10)
        self.assertTrue(self.residency.roomElsewhere("C"))
        self.assertEqual(self.plan(waited=1000.0, owners=(A, C)), LoadPlan((A,)))
        self.start("A", "m", 6)
        self.assertEqual(self.plan(waited=1000.0, owners=(A, C)), LoadPlan((C,), C))

    def test_busyCopyGivesWayByDemandPerCopy(self) -> None:
        """A busy copy of a model resident elsewhere gives way by the same rule (it drains
        first): the most popular model's second copy takes the place of a less popular
        one's, never the other way round."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.start("C", "x", 1)  # x: 1 a minute over 2 copies; m: 2 over 2
        self.assertEqual(self.planner.cheapest((C,), "m").tier, Tier.DISPLACE)
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((C,), C))
        self.start("C", "x", 3)  # x: 4 a minute over 2 copies
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((A,)))
