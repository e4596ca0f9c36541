"""A new conversation goes apart from its family on engines whose prompt cache moves saved
prompts (``choose``'s first clause of rule 1, spec §11 "Placement")."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.placement.choose import HOLD_MAX, Hold, Placed
from nvpair.proxy.placement.keys import AffinityKey, keyFor
from tests.support.cases.placementfleet import (
    CHAT,
    NODES,
    Fleet,
    followUp,
    request,
    tenantPrompt,
)


def moving(fleet: Fleet, *nodeIds: str) -> Fleet:
    """``fleet`` with the engines of ``nodeIds`` (all by default) identified as moving."""
    assert fleet.states is not None
    for nodeId in nodeIds or [n.id for n in NODES]:
        fleet.states.identified(nodeId, True)
    return fleet


class ApartTests(SynchronousTestCase):
    """On llama-server's prompt cache a tenant's conversations on one engine rob each
    other's saved turns; placement keeps them apart while it can."""

    def test_secondConversationGoesApart(self) -> None:
        """The tenant's second conversation goes to an owner holding none of its prompt (a
        miss), whatever the system prompt costs; each conversation's next turn goes home."""
        fleet = moving(Fleet())
        first, _ = fleet.place(request(tenantPrompt(1), "first user"))
        second, result = fleet.place(request(tenantPrompt(1), "second user"))
        self.assertEqual((second != first, result), (True, Placed.MISS))
        again = fleet.place(followUp(tenantPrompt(1), "second user", "more"))
        self.assertEqual(again, (second, Placed.HIT))
        again = fleet.place(followUp(tenantPrompt(1), "first user", "more"))
        self.assertEqual(again, (first, Placed.HIT))

    def test_oncePerOwner(self) -> None:
        """Four owners: the tenant's first four conversations land one on each; the fifth,
        with every owner holding the family, goes to a holder."""
        fleet = moving(Fleet())
        placed = [fleet.place(request(tenantPrompt(2), f"user {i}"))[0] for i in range(5)]
        self.assertEqual(sorted(placed[:4]), ["A", "B", "C", "D"])
        self.assertEqual(fleet.place(request(tenantPrompt(2), "user 9"))[1], Placed.HIT)

    def test_copyingEnginesKeepItTogether(self) -> None:
        """Engines not known to move: together, as before; so too where only the others
        move (what the holder's engine does decides)."""
        for others in (False, True):
            fleet = Fleet()
            first, _ = fleet.place(request(tenantPrompt(1), "first user"))
            if others:
                moving(fleet, *[n.id for n in NODES if n.id != first])
            second = fleet.place(request(tenantPrompt(1), "second user"))
            self.assertEqual(second, (first, Placed.HIT), others)

    def test_fullApartHeldForAWhile(self) -> None:
        """Every owner without the family full, the holder with room: with the queue on, the
        request is held for the least loaded of them, at most ``HOLD_MAX``; that hold spent,
        or without the queue, it goes to its family's holder (never waiting in an engine
        while a slot is free)."""
        fleet = moving(Fleet())
        first, _ = fleet.place(request(tenantPrompt(1), "first user"))
        for node in NODES:
            fleet.report(node.id, busy=0 if node.id == first else 2)
        key = request(tenantPrompt(1), "second user")
        heldFor, result = fleet.place(key, hold=Hold.ALLOWED, serve=False)
        assert fleet.choice is not None
        self.assertEqual((heldFor != first, result, fleet.choice.hold), (True, None, HOLD_MAX))
        for hold in (Hold.SPENT, Hold.NONE):
            self.assertEqual(fleet.place(key, hold=hold, serve=False), (first, Placed.HIT))

    def test_everyoneFullWaitsApart(self) -> None:
        """No owner has room at all: it waits apart, in the engine of an owner without the
        family."""
        fleet = moving(Fleet())
        first, _ = fleet.place(request(tenantPrompt(1), "first user"))
        for node in NODES:
            fleet.report(node.id, busy=2)
        placed, result = fleet.place(request(tenantPrompt(1), "second user"))
        self.assertEqual((placed != first, result), (True, Placed.MISS))

    def test_clientNamedGroupStaysTogether(self) -> None:
        """A client that names its group (``prompt_cache_key``) asked for it together."""
        fleet = moving(Fleet())

        def grouped(user: str) -> AffinityKey:
            messages = [
                {"role": "system", "content": tenantPrompt(3)},
                {"role": "user", "content": user},
            ]
            doc = {"model": "m", "messages": messages, "prompt_cache_key": "tenant-3"}
            key = keyFor("llamacpp", "m", CHAT, doc)
            assert key is not None
            return key

        first, _ = fleet.place(grouped("first user"))
        second = fleet.place(grouped("second user"))
        self.assertEqual(second, (first, Placed.HIT))
