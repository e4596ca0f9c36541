"""Held for the prefix holder (spec §11 "Placement"): a request whose longest cached prefix
is on a full engine waits in the proxy, not in that engine, and goes there the moment it
has room, or recomputes on a free owner once waiting has cost what recomputing would."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.dispatch.holds import Holds
from nvpair.proxy.features import useStandalone
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.ops.queuegauges import QueueCollector, queueStatus
from nvpair.proxy.placement.choose import RECOMPUTE_SECONDS, holdBudget, recomputeSeconds
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest

SYSTEM = "You are the assistant of tenant one. Follow these rules carefully! " * 45
DEFAULT_BUDGET = holdBudget(len(SYSTEM), None)  # before any engine reported its prefill time


def chat(user: str) -> bytes:
    """A chat request of the tenant's (its long system prompt) from one user."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    return json.dumps({"model": "m1", "stream": True, "messages": messages}).encode()


class HoldsTests(SynchronousTestCase):
    """The held requests themselves, on a Clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.room: set[str] = set()
        self.holds = Holds(self.clock, lambda nodeId: nodeId in self.room, 3)

    def test_roomLetsOutInOrder(self) -> None:
        """Held for one node: let out first come first when it has room; others stay."""
        fired: list[str] = []
        for name, node in (("a1", "A"), ("b1", "B"), ("a2", "A")):
            wait = self.holds.hold(node, 5.0)
            assert wait is not None
            wait.addCallback(lambda _, held: fired.append(held), name)
        self.holds.release()
        self.assertEqual(fired, [])
        self.room.add("A")
        self.holds.release()
        self.assertEqual((fired, len(self.holds)), (["a1", "a2"], 1))
        self.assertEqual((self.holds.endedWithRoom, self.holds.endedWithBudget), (2, 0))

    def test_budgetRunsOut(self) -> None:
        """Without room, a hold ends when its budget does, and not before."""
        fired: list[None] = []
        wait = self.holds.hold("A", 0.4)
        assert wait is not None
        wait.addCallback(fired.append)
        self.clock.advance(0.39)
        self.assertEqual(fired, [])
        self.clock.advance(0.01)
        self.assertEqual((fired, len(self.holds), self.holds.endedWithBudget), ([None], 0, 1))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_cancelLeaves(self) -> None:
        """A cancelled hold (its client gone) leaves at once with its timer."""
        wait = self.holds.hold("A", 5.0)
        assert wait is not None
        wait.cancel()
        self.failureResultOf(wait, CancelledError)
        self.assertEqual((len(self.holds), self.clock.getDelayedCalls()), (0, []))
        self.room.add("A")
        self.holds.release()
        self.assertEqual((self.holds.endedWithRoom, self.holds.endedWithBudget), (0, 0))

    def test_bounded(self) -> None:
        """Beyond ``maxHeld`` nothing more is held, however many ask."""
        waits = [self.holds.hold("A", 5.0) for _ in range(100)]
        self.assertEqual(sum(w is not None for w in waits), 3)
        self.assertEqual(len(self.holds), 3)

    def test_budget(self) -> None:
        """The budget is what recomputing takes at the engine's reported prefill time per
        token (about four characters a token), 1 ms a token before any report, at most 5 s."""
        self.assertAlmostEqual(holdBudget(4000, 0.3), 0.3)
        self.assertEqual(holdBudget(4000, None), 1.0)
        self.assertEqual(holdBudget(10**9, 1.0), 5.0)


class HeldLoopCase(LoopCase):
    """Owners A and B with two slots each as their engines report, prefix placement, the
    queue on; the tenant's first request has made its home on one of them."""

    settings: dict[str, Any] = {"queueMax": 8, "queueTimeout": 30.0}

    def setUp(self) -> None:
        super().setUp()
        features = useStandalone(self.context, affinity=True)
        self.states, self.ledger, self.queueing = (
            features.states,
            features.ledger,
            features.queueing,
        )
        self.report("A", 0)
        self.report("B", 0)
        self.start(body=chat("alice: how do I pay?"))
        self.home = self.upstream.calls[0].nodeId
        self.other = "B" if self.home == "A" else "A"
        self.first = self.upstream.calls[0].respond(200)
        self.first.send(b"{}")

    def report(self, nodeId: str, busy: int, interval: float = 1.0) -> None:
        """A fresh probe of ``nodeId``: ``busy`` of its two slots taken."""
        self.states.record(nodeId, EngineReport(busy=busy, total=2), interval, "/slots")
        self.ledger.probeSent(nodeId)
        self.ledger.probed(nodeId, busy, 2, interval)

    def held(self) -> int:
        """Requests held so far (held now, and holds ended either way)."""
        holds = self.queueing.holds
        return len(holds) + holds.endedWithRoom + holds.endedWithBudget

    def holdSecond(self) -> FakeRequest:
        """The home's slots all taken (by clients the proxy does not see), the other
        owner free: a second user of the tenant asks."""
        self.report(self.home, 2, interval=60.0)
        self.report(self.other, 0, interval=60.0)
        _, request = self.start(body=chat("bob: where is my parcel?"))
        return request


class HeldLoopTests(HeldLoopCase):
    """The placement loop holds, then places again."""

    def test_heldThenHomeHasRoom(self) -> None:
        """Held with nothing sent, reserved or counted in flight; two probes in a row
        showing the home with a free slot (one could catch a direct client between two of
        its requests) send it there."""
        self.assertGreater(recomputeSeconds(len(SYSTEM), None), RECOMPUTE_SECONDS)
        self.holdSecond()
        self.assertEqual(
            (len(self.upstream.calls), self.held(), len(self.queueing.holds)), (1, 1, 1)
        )
        self.assertEqual(self.context.reservations.reservedCount(self.other), 0)
        self.report(self.home, 1, interval=60.0)
        self.assertEqual(len(self.upstream.calls), 1)
        self.report(self.home, 1, interval=60.0)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.upstream.calls[1].nodeId, self.home)
        self.assertEqual(len(self.queueing.holds), 0)
        assert self.context.affinity is not None
        counts = self.context.affinity.countsOf("llamacpp")
        self.assertEqual(counts, {"hit": 1, "miss": 1, "overridden": 0})  # counted once

    def test_ourRequestEndingLetsOut(self) -> None:
        """One of ours ending on the home gives the held request its slot."""
        self.holdSecond()
        self.first.end()
        self.assertEqual(self.upstream.calls[1].nodeId, self.home)

    def test_budgetSpentRecomputesElsewhere(self) -> None:
        """No room on the home within the budget (the default, before any prefill time
        was reported): it goes to the free owner, overridden."""
        self.holdSecond()
        self.clock.advance(DEFAULT_BUDGET - 0.01)
        self.assertEqual(len(self.upstream.calls), 1)
        self.clock.advance(0.01)
        self.assertEqual(self.upstream.calls[1].nodeId, self.other)
        assert self.context.affinity is not None
        self.assertEqual(self.context.affinity.countsOf("llamacpp")["overridden"], 1)

    def test_budgetFromReportedPrefill(self) -> None:
        """With the free owner's prefill time reported, the hold lasts what recomputing
        the prompt there takes."""
        self.states.served(self.other, 1000, 0, promptMs=800.0)  # 0.8 ms a token
        self.holdSecond()
        budget = holdBudget(len(SYSTEM), 0.8)
        self.assertLess(budget, DEFAULT_BUDGET)
        self.clock.advance(budget - 0.01)
        self.assertEqual(len(self.upstream.calls), 1)
        self.clock.advance(0.01)
        self.assertEqual(self.upstream.calls[1].nodeId, self.other)

    def test_clientLeavesWhileHeld(self) -> None:
        """A client that leaves while held is never sent, and leaves nothing behind."""
        request = self.holdSecond()
        request.lose()
        self.assertEqual(len(self.queueing.holds), 0)
        self.report(self.home, 0, interval=60.0)
        self.clock.advance(10)
        self.assertEqual(len(self.upstream.calls), 1)


class NoHoldTests(HeldLoopCase):
    """With the queue off there is no hold: the request waits for its prefix holder in
    that engine, as before."""

    settings: dict[str, Any] = {"queueMax": 0}

    def test_sentToTheHolder(self) -> None:
        """Sent at once to the full home: nothing held."""
        self.holdSecond()
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.upstream.calls[1].nodeId, self.home)
        self.assertEqual(len(self.queueing.holds), 0)


class HeldVisibleTests(HeldLoopCase):
    """Holds as ``/metrics`` and ``/status`` show them, and the affinity's held count."""

    def test_metricsAndStatus(self) -> None:
        """Held now, holds ended by room and by budget, placements counted ``held``."""
        self.holdSecond()
        self.start(body=chat("carol: reset my password"))
        registry = CollectorRegistry()
        registry.register(QueueCollector(lambda: self.queueing))
        text = generate_latest(registry).decode()
        self.assertIn("nvpair_proxy_held_requests 2.0", text)
        for _ in range(2):  # one slot, said twice: the first held goes there
            self.report(self.home, 1, interval=60.0)
        self.clock.advance(DEFAULT_BUDGET)  # the second recomputes elsewhere
        text = generate_latest(registry).decode()
        self.assertIn('nvpair_proxy_holds_total{result="room"} 1.0', text)
        self.assertIn('nvpair_proxy_holds_total{result="budget"} 1.0', text)
        status = queueStatus(self.queueing)
        assert status is not None
        self.assertEqual(status["held"], {"now": 0, "endedWithRoom": 1, "endedWithBudget": 1})
        self.assertEqual([c.nodeId for c in self.upstream.calls[1:]], [self.home, self.other])
        self.assertEqual(self.held(), 2)
