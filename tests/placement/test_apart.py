"""A new conversation goes apart from its family's where its family is cheap to recompute
(``choose``'s first clause of rule 1, spec §11 "Placement")."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.placement.choose import RECOMPUTE_SECONDS, Placed, recomputeSeconds
from tests.support.cases.placementfleet import NODES, Fleet, followUp, request, tenantPrompt

SHORT = "Be brief and answer in the user's language. " * 18  # 792 characters


class ApartTests(SynchronousTestCase):
    """A tenant's conversations on one engine rob each other on llama.cpp's prompt cache."""

    def test_secondConversationGoesApart(self) -> None:
        """The tenant's second conversation, its system prompt cheap to recompute, goes to
        an owner that holds none of it (a miss); its next turn goes back there."""
        self.assertLessEqual(recomputeSeconds(len(SHORT), None), RECOMPUTE_SECONDS)
        fleet = Fleet()
        first, _ = fleet.place(request(SHORT, "first user"))
        second, result = fleet.place(request(SHORT, "second user"))
        self.assertEqual((second != first, result), (True, Placed.MISS))
        self.assertEqual(fleet.place(followUp(SHORT, "second user", "more")), (second, Placed.HIT))
        self.assertEqual(fleet.place(followUp(SHORT, "first user", "more")), (first, Placed.HIT))

    def test_noRoomApartStaysWithItsFamily(self) -> None:
        """Every owner without the family full: the family's holder, as before."""
        fleet = Fleet()
        first, _ = fleet.place(request(SHORT, "first user"))
        for node in NODES:
            fleet.report(node.id, busy=0 if node.id == first else 2)
        self.assertEqual(fleet.place(request(SHORT, "second user")), (first, Placed.HIT))

    def test_costlyFamilyKeptTogether(self) -> None:
        """A system prompt dearer than ``RECOMPUTE_SECONDS`` to recompute (2.6k characters
        at the default rate): the tenant's conversations stay together."""
        self.assertGreater(recomputeSeconds(len(tenantPrompt(1)), None), RECOMPUTE_SECONDS)
        fleet = Fleet()
        first, _ = fleet.place(request(tenantPrompt(1), "first user"))
        self.assertEqual(fleet.place(request(tenantPrompt(1), "second user")), (first, Placed.HIT))

    def test_slowEngineKeepsItTogether(self) -> None:
        """The same short prompt on engines that report 7 ms a token (1.4 s to recompute):
        kept together."""
        fleet = Fleet()
        assert fleet.states is not None
        for node in NODES:
            fleet.states.served(node.id, 1000, 0, promptMs=7000.0)
        first, _ = fleet.place(request(SHORT, "first user"))
        self.assertEqual(fleet.place(request(SHORT, "second user")), (first, Placed.HIT))
