"""A request waiting in an engine's own queue before its first token is moved to an owner
with a free slot (spec §11 "Moved before its first token"; ``flow.enginequeues``), on a
Clock through the standalone placement loop."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.features import useStandalone
from nvpair.proxy.flow import enginequeues
from nvpair.proxy.flow.enginequeues import (
    FLOOR,
    PREFILL_FACTOR,
    STEP,
    EngineQueues,
    firstTokenBudget,
)
from nvpair.proxy.flow.interfaces import IMovable
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.states import EngineStates
from tests.support.exchangecase import LoopCase
from tests.support.fakeupstream import CHAT, node

FRESH = 60.0  # probe interval of the reports below: they stay fresh through every test

BUDGET = firstTokenBudget(len(CHAT), None)


class BudgetTests(SynchronousTestCase):
    """The first-token budget: a floor, plus the prompt's prefill estimated from its body."""

    def test_floorPlusPrefill(self) -> None:
        self.assertAlmostEqual(firstTokenBudget(0, 5.0), FLOOR)
        self.assertAlmostEqual(firstTokenBudget(4000, 2.0), FLOOR + PREFILL_FACTOR * 2.0)
        self.assertAlmostEqual(firstTokenBudget(4000, None), FLOOR + PREFILL_FACTOR * 1.0)


class MoveTests(LoopCase):
    """Owners A and B of ``m1``, each one slot, both reporting them."""

    def setUp(self) -> None:
        super().setUp()
        standalone = useStandalone(self.context, affinity=False)
        self.ledger: RoomLedger = standalone.ledger
        self.queues = standalone.engineQueues
        self.report("A", 0)
        self.report("B", 0)

    def report(self, nodeId: str, busy: int, total: int = 1) -> None:
        self.ledger.probeSent(nodeId)
        self.ledger.probed(nodeId, busy, total, FRESH)

    def wait(self, seconds: float) -> None:
        for _ in range(round(seconds / STEP)):
            self.clock.advance(STEP)

    def test_movedToTheFreeOwner(self) -> None:
        """No first token past its budget while the other owner has a free slot: the
        attempt is given up (its call cancelled), the node's slot is taken as foreign, and
        the request goes to the other owner, where it is served."""
        exchange, request = self.start()
        first = self.upstream.calls[0]
        self.wait(BUDGET - 2 * STEP)
        self.assertEqual(len(self.upstream.calls), 1, "within its budget: not moved")
        self.wait(3 * STEP)
        self.assertTrue(first.cancelled)
        self.assertEqual(len(self.upstream.calls), 2)
        second = self.upstream.calls[1]
        self.assertNotEqual(second.nodeId, first.nodeId)
        self.assertEqual(self.ledger.free(first.nodeId), 0, "its slot is known taken")
        self.assertEqual(self.queues.moved, 1)
        response = second.respond(200)
        response.send(b"data: {}\n\n")
        response.end()
        self.assertEqual(request.code, 200)
        self.assertEqual(exchange.attempts, 2)
        self.assertReleased()
        self.assertEqual(len(self.queues), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [], "no watch timer left")

    def test_noRoomElsewhereStays(self) -> None:
        """The other owner is full: the request stays where it waits, however long."""
        self.report("B", 1)
        self.start()
        self.wait(5.0)
        self.assertEqual(len(self.upstream.calls), 1)
        self.assertFalse(self.upstream.calls[0].cancelled)
        self.report("B", 0)  # a slot frees there (two reports say so): the next check
        self.report("B", 0)  # moves it
        self.wait(2 * STEP)
        self.assertTrue(self.upstream.calls[0].cancelled)
        self.assertEqual(self.upstream.calls[1].nodeId, "B")

    def test_movedAtMostOnce(self) -> None:
        """Moved once, its next attempt is not watched: it waits there."""
        self.start()
        self.wait(BUDGET + 2 * STEP)
        self.assertEqual(len(self.upstream.calls), 2)
        self.report(self.upstream.calls[0].nodeId, 0)  # free again where it was
        self.report(self.upstream.calls[0].nodeId, 0)
        self.wait(5.0)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.queues.moved, 1)

    def test_firstTokenInTimeNotWatched(self) -> None:
        """A first token within its budget ends the watch: nothing moves later."""
        self.start()
        self.upstream.calls[0].respond(200).send(b"data: {}\n\n")
        self.wait(5.0)
        self.assertEqual(len(self.upstream.calls), 1)
        self.assertEqual(len(self.queues), 0)
        self.assertEqual(self.queues.moved, 0)

    def test_unstreamedNotWatched(self) -> None:
        """A request that is not streamed has its first byte only at the end: not watched."""
        self.start(body=b'{"model":"m1","messages":[{"role":"user","content":"hi"}]}')
        self.wait(5.0)
        self.assertEqual(len(self.upstream.calls), 1)
        self.assertEqual(len(self.queues), 0)

    def test_unreportedSlotsStay(self) -> None:
        """On a node whose slots are not reported (Ollama), a slow first token may be a
        load or a long prompt: it is not moved."""
        self.ledger.probeFailed("A")
        self.ledger.probeFailed("B")
        self.ledger.configure("A", 1)
        self.ledger.configure("B", 1)
        self.start()
        self.wait(5.0)
        self.assertEqual(len(self.upstream.calls), 1)
        self.assertEqual(self.queues.moved, 0)

    def test_clientGoneStopsWatching(self) -> None:
        """The client leaves while it waits: the watch goes with it, and its timer."""
        _, request = self.start()
        request.lose()
        self.assertEqual(len(self.queues), 0)
        self.wait(5.0)
        self.assertEqual(len(self.upstream.calls), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])


@implementer(IMovable)
class Attempted:
    """An attempt on ``nodeId``, never moved."""

    def __init__(self, nodeId: str) -> None:
        self.node = node(nodeId)

    def move(self) -> bool:
        raise AssertionError("not watched, never moved")


class WatchedWhereTests(SynchronousTestCase):
    """Which attempts are watched at all."""

    def queues(self, ours: int, busy: int) -> EngineQueues:
        clock = Clock()
        ledger = RoomLedger(clock, {"A": ours})
        ledger.probeSent("A")
        ledger.probed("A", busy, 1, FRESH)
        return EngineQueues(clock, ledger, EngineStates(clock, ledger), None)

    def test_sentWithRoomWatched(self) -> None:
        """Its own slot counted, the node's report still has room for it: watched."""
        queues = self.queues(ours=1, busy=1)
        queues.watch(Attempted("A"), "m1", lambda: (), len(CHAT))
        self.assertEqual(len(queues), 1)

    def test_boundedWatch(self) -> None:
        """Past ``MAX_WATCHED`` entries a further attempt is not watched (it waits where it
        was sent, as before the watch)."""
        self.patch(enginequeues, "MAX_WATCHED", 3)
        queues = self.queues(ours=0, busy=0)
        for _ in range(5):
            queues.watch(Attempted("A"), "m1", lambda: (), len(CHAT))
        self.assertEqual(len(queues), 3)

    def test_sentToAFullNodeNotWatched(self) -> None:
        """Sent where the report had no room (to wait there on purpose, for its cached
        prefix), or to a node whose slots are not reported: not watched."""
        queues = self.queues(ours=2, busy=1)
        queues.watch(Attempted("A"), "m1", lambda: (), len(CHAT))
        queues.watch(Attempted("B"), "m1", lambda: (), len(CHAT))
        self.assertEqual(len(queues), 0)


@implementer(IMovable)
class Moving:
    """An attempt on ``nodeId`` whose move lets another request's first attempt start
    (``then``), as a move's new round may."""

    def __init__(self, nodeId: str, then: Callable[[], None]) -> None:
        self.node = node(nodeId)
        self.then = then

    def move(self) -> bool:
        self.then()
        return True


class OneTimerTests(SynchronousTestCase):
    """The watch keeps one timer, whatever a move starts."""

    def test_watchDuringAMove(self) -> None:
        clock = Clock()
        ledger = RoomLedger(clock, {"A": 1})
        for nodeId, busy in (("A", 1), ("B", 0)):
            ledger.probeSent(nodeId)
            ledger.probed(nodeId, busy, 2, FRESH)
        queues = EngineQueues(clock, ledger, EngineStates(clock, ledger), None)
        owners = (node("A"), node("B"))
        later = Attempted("A")
        queues.watch(
            Moving("A", lambda: queues.watch(later, "m1", lambda: owners, 0)),
            "m1",
            lambda: owners,
            0,
        )
        clock.advance(FLOOR + STEP)
        self.assertEqual(len(queues), 1, "the one the move started")
        self.assertEqual(len(clock.getDelayedCalls()), 1)


class SlotTakenTests(SynchronousTestCase):
    """The ledger after a move: the slot it counted free is foreign until two reports."""

    def test_foreignRisesAndFallsOnTwoReports(self) -> None:
        ours: dict[str, int] = {}
        ledger = RoomLedger(Clock(), ours)
        ledger.probeSent("A")
        ledger.probed("A", 1, 2, FRESH)
        self.assertEqual(ledger.free("A"), 1)
        ledger.slotTaken("A")
        self.assertEqual(ledger.free("A"), 0)
        ledger.slotTaken("A")
        self.assertEqual(ledger.free("A"), 0, "never more than the reported total")
        ledger.probeSent("A")
        ledger.probed("A", 1, 2, FRESH)
        self.assertEqual(ledger.free("A"), 0, "one report does not free it")
        ledger.probeSent("A")
        ledger.probed("A", 1, 2, FRESH)
        self.assertEqual(ledger.free("A"), 1)

    def test_unreportedIgnored(self) -> None:
        ledger = RoomLedger(Clock(), {})
        ledger.slotTaken("A")
        self.assertIsNone(ledger.free("A"))
