"""A full prefix holder keeps its request while the fleet has no spare slots (``choose``'s
``SPARE_SLOTS`` rule, spec §11 "Placement")."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.placement.choose import HOLD_MAX, Hold, Placed
from tests.support.cases.placementfleet import NODES, Fleet, request, tenantPrompt


def _fleet(freeElsewhere: tuple[int, ...], service: float | None = 2.0) -> tuple[Fleet, str]:
    """Four two-slot owners: the tenant's home full of ours (taking ``service`` seconds a
    slot there, as the ledger saw one end), the others with ``freeElsewhere`` free slots."""
    fleet = Fleet()
    assert fleet.ledger is not None
    home, _ = fleet.place(request(tenantPrompt(1), "first user"))
    others = iter(freeElsewhere)
    fleet.ours[home] = 2
    for node in NODES:
        fleet.report(node.id, busy=2 if node.id == home else 2 - next(others))
    if service is not None:
        fleet.ledger.finished(home, service)
    return fleet, home


class StayTests(SynchronousTestCase):
    """Recomputing on the fleet's last free slot only trades places with whoever wanted it."""

    def test_lastFreeSlotKeepsTheRequestAtItsHolder(self) -> None:
        """One slot free in the fleet, the holder's slot expected within ``HOLD_MAX``: the
        request goes to its holder (to wait in its engine), neither held nor moved, also
        once a hold was spent."""
        fleet, home = _fleet((1, 0, 0))
        for hold in (Hold.NONE, Hold.ALLOWED, Hold.SPENT):
            key = request(tenantPrompt(1), f"second user {hold.name}")
            self.assertEqual(fleet.place(key, serve=False, hold=hold), (home, Placed.HIT))
            assert fleet.choice is not None
            self.assertIsNone(fleet.choice.hold)

    def test_spareSlotsStillMoveIt(self) -> None:
        """Two slots free (on one owner or two): spare capacity, the hold and the recompute
        stand as before."""
        for free in ((2, 0, 0), (1, 1, 0)):
            fleet, home = _fleet(free)
            key = request(tenantPrompt(1), "second user")
            self.assertEqual(fleet.place(key, serve=False, hold=Hold.ALLOWED), (home, None))
            moved, result = fleet.place(key, serve=False, hold=Hold.SPENT)
            self.assertEqual((moved != home, result), (True, Placed.OVERRIDDEN))

    def test_longWaitStillMovesIt(self) -> None:
        """The holder's slot expected later than ``HOLD_MAX`` (its requests take long), or
        its wait not known yet: the usual rule, the request recomputes elsewhere."""
        for service in (2 * HOLD_MAX * 1.5, None):
            fleet, home = _fleet((1, 0, 0), service)
            key = request(tenantPrompt(1), "second user")
            moved, result = fleet.place(key, serve=False, hold=Hold.SPENT)
            self.assertEqual((moved != home, result), (True, Placed.OVERRIDDEN))

    def test_holderRoomUnknown(self) -> None:
        """Without the engines' slots nothing is known free: the rule does not apply, and
        a spent hold on a holder loaded beyond the others recomputes elsewhere as before."""
        fleet = Fleet(states=False)
        home, _ = fleet.place(request(tenantPrompt(2), "q"))
        for _ in range(3):
            fleet.reservations.reserve(home)
        key = request(tenantPrompt(2), "other")
        self.assertEqual(fleet.place(key, hold=Hold.SPENT)[1], Placed.OVERRIDDEN)
