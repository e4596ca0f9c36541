"""The node breaker's transitions on a clock and its order."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.flow import breaker as b
from nvpair.proxy.flow.breaker import Breakers, BreakerState, retryAfterSeconds
from nvpair.proxy.nodestate.table import MAX_NODES
from nvpair.proxy.routing.nodes import Node

A, B, C = (Node(n, False, (n,), frozenset({"m"})) for n in ("a", "b", "c"))


def _open(breakers: Breakers, nodeId: str, now: float = 0.0) -> None:
    for _ in range(b.THRESHOLD):
        breakers.failed(nodeId, now)


class TransitionTests(SynchronousTestCase):
    """Closed, open, half-open and back."""

    def test_opensAtThreshold(self) -> None:
        """Fewer failures than the threshold leave it closed; the threshold opens it."""
        breakers = Breakers()
        for _ in range(b.THRESHOLD - 1):
            breakers.failed("a", 0.0)
        self.assertEqual(breakers.state("a", 0.0), BreakerState.CLOSED)
        breakers.failed("a", 0.0)
        self.assertEqual(breakers.state("a", 0.0), BreakerState.OPEN)
        self.assertEqual(breakers.opened, 1)

    def test_windowForgets(self) -> None:
        """Failures spread wider than the window never open it."""
        breakers = Breakers()
        for i in range(b.THRESHOLD * 3):
            breakers.failed("a", i * (b.WINDOW / (b.THRESHOLD - 1) + 0.1))
        self.assertEqual(breakers.opened, 0)

    def test_halfOpenProbeThenClose(self) -> None:
        """After the cool-down one request probes it; success closes it."""
        breakers = Breakers()
        _open(breakers, "a")
        self.assertEqual(breakers.order((A, B), 0.5), ((B,), (A,)))
        now = b.BASE_COOLDOWN
        self.assertEqual(breakers.state("a", now), BreakerState.HALF_OPEN)
        self.assertEqual(breakers.order((B, A), now), ((A,), (B,)))  # the probe goes first
        self.assertEqual(breakers.order((B, A), now), ((B,), (A,)))  # only one probe at once
        breakers.succeeded("a")
        self.assertEqual(breakers.state("a", now), BreakerState.CLOSED)
        self.assertEqual(breakers.order((B, A), now), ((B, A), ()))

    def test_probeFailureDoublesUpToCap(self) -> None:
        """A failed probe opens it for twice the cool-down, never past the cap."""
        breakers = Breakers()
        _open(breakers, "a")
        now = 0.0
        cooldown = b.BASE_COOLDOWN
        for _ in range(12):
            now += cooldown
            self.assertEqual(breakers.order((A, B), now)[0], (A,))
            breakers.failed("a", now)
            cooldown = min(cooldown * 2, b.MAX_COOLDOWN)
            self.assertEqual(breakers.state("a", now + cooldown - 0.01), BreakerState.OPEN)
            self.assertEqual(breakers.state("a", now + cooldown), BreakerState.HALF_OPEN)
        self.assertEqual(cooldown, b.MAX_COOLDOWN)

    def test_retryAfterIsAMinimum(self) -> None:
        """An engine's Retry-After longer than the cool-down keeps it open that long."""
        breakers = Breakers()
        for _ in range(b.THRESHOLD):
            breakers.failed("a", 0.0, 7.0)
        self.assertEqual(breakers.state("a", 6.9), BreakerState.OPEN)
        self.assertEqual(breakers.state("a", 7.0), BreakerState.HALF_OPEN)

    def test_probeLeaseExpires(self) -> None:
        """A probe with no verdict passes to another request after the lease."""
        breakers = Breakers()
        _open(breakers, "a")
        now = b.BASE_COOLDOWN
        self.assertEqual(breakers.order((A, B), now)[0], (A,))
        self.assertEqual(breakers.order((A, B), now + 1)[0], (B,))
        self.assertEqual(breakers.order((A, B), now + b.PROBE_LEASE)[0], (A,))

    def test_allOpenUsualOrder(self) -> None:
        """When nothing else can serve, the open nodes are tried in the usual order."""
        breakers = Breakers()
        _open(breakers, "a")
        _open(breakers, "b")
        self.assertEqual(breakers.order((A, B), 0.1), ((A, B), ()))

    def test_bounded(self) -> None:
        """Per-node state is bounded, whatever the number of failing nodes."""
        breakers = Breakers()
        for i in range(MAX_NODES * 2):
            breakers.failed(f"n{i}", 0.0)
        self.assertEqual(len(breakers), MAX_NODES)

    def test_snapshot(self) -> None:
        """The status view names state, opens and the time left."""
        breakers = Breakers()
        _open(breakers, "a")
        view = breakers.snapshot(0.25)
        self.assertEqual(view["a"]["state"], "open")
        self.assertEqual(view["a"]["opens"], 1)
        self.assertEqual(view["a"]["retryInSeconds"], 0.75)

    def test_retryAfterParsing(self) -> None:
        """Delay-seconds only, capped; anything else is absent."""
        self.assertEqual(retryAfterSeconds([b" 5 "]), 5.0)
        self.assertEqual(retryAfterSeconds([b"99999"]), b.MAX_COOLDOWN)
        for bad in (None, [], [b"soon"], [b"-1"], [b"Wed, 21 Oct 2015 07:28:00 GMT"]):
            self.assertIsNone(retryAfterSeconds(bad))
