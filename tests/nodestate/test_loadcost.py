"""What a load costs (``LoadCosts``) and how many requests an engine serves at once
(``ConcurrencyEstimator``): pure, on a ``Clock``."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.nodestate.concurrency import FORGET_AFTER, MAX_LEVEL, ConcurrencyEstimator
from nvpair.proxy.nodestate.loadcost import DEFAULT_LOAD_SECONDS, LoadCosts, LoadEvidence


class LoadCostTests(SynchronousTestCase):
    """Load seconds per (node, model): evidence in order of trust, fallbacks, bounds."""

    def test_defaultThenLearnt(self) -> None:
        """Nothing known: the conservative default; then the moving average (weight ½)."""
        costs = LoadCosts()
        self.assertEqual(costs.estimate("n", "m"), DEFAULT_LOAD_SECONDS)
        costs.observe("n", "m", 4.0, LoadEvidence.FIRST_BYTE)
        self.assertEqual(costs.estimate("n", "m"), 4.0)
        costs.observe("n", "m", 2.0, LoadEvidence.FIRST_BYTE)
        self.assertEqual(costs.estimate("n", "m"), 3.0)

    def test_trustOrder(self) -> None:
        """The engine's own figure beats a status transition, which beats a first byte."""
        costs = LoadCosts()
        costs.observe("n", "m", 9.0, LoadEvidence.FIRST_BYTE)
        costs.observe("n", "m", 5.0, LoadEvidence.TRANSITION)
        self.assertEqual(costs.estimate("n", "m"), 5.0)
        costs.observe("n", "m", 3.0, LoadEvidence.REPORTED)
        self.assertEqual(costs.estimate("n", "m"), 3.0)
        costs.observe("n", "m", 100.0, LoadEvidence.FIRST_BYTE)
        self.assertEqual(costs.estimate("n", "m"), 3.0)

    def test_ollamaLoadDuration(self) -> None:
        """Ollama's ``load_duration`` (ns) counts as a load only from 0.1 s: a warm model
        reports a few milliseconds."""
        costs = LoadCosts()
        self.assertFalse(costs.loadDuration("n", "m", 12_000_000))
        self.assertIsNone(costs.known("n", "m"))
        self.assertTrue(costs.loadDuration("n", "m", 2_500_000_000))
        self.assertEqual(costs.known("n", "m"), 2.5)
        self.assertFalse(costs.loadDuration("n", "m", True))

    def test_fallbacks(self) -> None:
        """Unknown here: the model's cost elsewhere, else the node's other models'."""
        costs = LoadCosts()
        costs.observe("a", "m", 2.0, LoadEvidence.REPORTED)
        costs.observe("b", "m", 4.0, LoadEvidence.REPORTED)
        costs.observe("c", "x", 7.0, LoadEvidence.REPORTED)
        self.assertEqual(costs.estimate("c", "m"), 3.0)
        self.assertEqual(costs.estimate("c", "y"), 7.0)
        costs.forget("c")
        self.assertEqual(costs.estimate("c", "y"), DEFAULT_LOAD_SECONDS)

    def test_bounded(self) -> None:
        """Past its bound the least recently observed pair is forgotten."""
        costs = LoadCosts(maxEntries=3)
        for i in range(5):
            costs.observe("n", f"m{i}", float(i), LoadEvidence.REPORTED)
        self.assertEqual(len(costs), 3)
        self.assertIsNone(costs.known("n", "m0"))
        self.assertEqual(costs.known("n", "m4"), 4.0)

    @settings(max_examples=200)
    @given(st.floats(allow_nan=True, allow_infinity=True))
    def test_anyNumber(self, seconds: float) -> None:
        """Whatever number arrives, the estimate stays a finite, non-negative figure."""
        costs = LoadCosts()
        costs.observe("n", "m", seconds, LoadEvidence.REPORTED)
        estimate = costs.estimate("n", "m")
        self.assertTrue(math.isfinite(estimate) and 0 <= estimate <= 3600)


class ConcurrencyTests(SynchronousTestCase):
    """Learning an engine's parallel slots from its waits before the first byte."""

    def feed(self, estimator: ConcurrencyEstimator, level: int, wait: float, n: int = 4) -> None:
        for _ in range(n):
            estimator.observe("o", level, wait + 0.3, work=0.3)

    def test_riseMarksTheLimit(self) -> None:
        """Waits flat up to 4 running, then a whole answer's wait: 4 at once."""
        estimator = ConcurrencyEstimator(Clock())
        for level in range(1, 5):
            self.feed(estimator, level, 0.02)
        self.assertIsNone(estimator.learnt("o"), "no rise seen: no limit")
        self.feed(estimator, 5, 3.0)
        self.assertEqual(estimator.learnt("o"), 4)
        self.assertEqual(estimator.snapshot("o")["learnt"], 4)

    def test_needsSamplesAndForgets(self) -> None:
        """A level counts from two samples; a level unseen for ten minutes is forgotten,
        so a limit lapses unless traffic confirms it."""
        clock = Clock()
        estimator = ConcurrencyEstimator(clock)
        self.feed(estimator, 1, 0.01, n=1)
        self.feed(estimator, 2, 5.0, n=2)
        self.assertIsNone(estimator.learnt("o"), "no baseline: one sample at level 1")
        self.feed(estimator, 1, 0.01, n=1)
        self.assertEqual(estimator.learnt("o"), 1)
        clock.advance(FORGET_AFTER + 1)
        self.assertIsNone(estimator.learnt("o"))
        self.feed(estimator, 1, 0.01, n=2)
        self.feed(estimator, 2, 5.0, n=1)
        self.assertIsNone(estimator.learnt("o"), "one sample at the risen level")
        self.feed(estimator, 2, 5.0, n=1)
        self.assertEqual(estimator.learnt("o"), 1)
        clock.advance(FORGET_AFTER + 1)
        self.assertIsNone(estimator.learnt("o"))

    def test_queued(self) -> None:
        """What a wait shows queued inside the engine: beyond the baseline when over twice
        it plus the slack (0.1 s of unknown service time; an eighth of it, at least 0.04 s,
        for short answers); nothing before a baseline."""
        services = {"o": 0.32}
        estimator = ConcurrencyEstimator(Clock(), service=services.get)
        self.assertEqual(estimator.queued("o", 5.0), 0.0)
        self.feed(estimator, 1, 0.02)
        self.assertEqual(estimator.queued("o", 0.07), 0.0)
        self.assertAlmostEqual(estimator.queued("o", 0.09), 0.07)
        self.assertAlmostEqual(estimator.queued("o", 2.02), 2.0)
        del services["o"]
        estimator.learnt("o")
        self.assertEqual(estimator.queued("o", 0.13), 0.0)
        self.assertAlmostEqual(estimator.queued("o", 0.15), 0.13)

    def test_queuedForgetsAStaleBaseline(self) -> None:
        """A baseline unseen for ``FORGET_AFTER`` seconds is no baseline, as for ``learnt``."""
        clock = Clock()
        estimator = ConcurrencyEstimator(clock)
        self.feed(estimator, 1, 0.02)
        self.assertAlmostEqual(estimator.queued("o", 2.02), 2.0)
        clock.advance(FORGET_AFTER + 1)
        self.assertEqual(estimator.queued("o", 2.02), 0.0)

    def test_ignoresNonsense(self) -> None:
        """Levels out of range and non-finite times are not samples."""
        estimator = ConcurrencyEstimator(Clock(), maxNodes=1)
        estimator.observe("o", 0, 1.0)
        estimator.observe("o", MAX_LEVEL + 1, 1.0)
        estimator.observe("o", 1, math.nan)
        self.assertEqual(estimator.snapshot("o")["levels"], {})
        estimator.observe("o", 1, 1.0)
        estimator.observe("p", 1, 1.0)
        self.assertEqual(estimator.snapshot("p")["levels"], {}, "one node at most")

    def test_shortAnswersRiseLess(self) -> None:
        """On an engine whose answers take a third of a second, a queued request waits about
        a tenth of a second (the rest of a running answer): a rise there, where the same
        wait on an engine of unknown service time is jitter."""
        services = {"o": 0.32}
        fast = ConcurrencyEstimator(Clock(), service=services.get)
        unknown = ConcurrencyEstimator(Clock())
        for estimator in (fast, unknown):
            for level in (1, 2):
                self.feed(estimator, level, 0.02)
            self.feed(estimator, 3, 0.1)
        self.assertEqual(fast.learnt("o"), 2)
        self.assertIsNone(unknown.learnt("o"))
        services["o"] = 5.0  # long answers: the slack is ``RISE_SLACK`` again
        slow = ConcurrencyEstimator(Clock(), service=services.get)
        for level, wait in ((1, 0.02), (2, 0.02), (3, 0.1)):
            self.feed(slow, level, wait)
        self.assertIsNone(slow.learnt("o"))
        services["o"] = 0.004  # answers in milliseconds: jitter under load is no limit
        instant = ConcurrencyEstimator(Clock(), service=services.get)
        for level, wait in ((1, 0.002), (2, 0.002), (3, 0.03)):
            self.feed(instant, level, wait)
        self.assertIsNone(instant.learnt("o"))
        self.feed(instant, 4, 0.2)
        self.assertEqual(instant.learnt("o"), 3)
