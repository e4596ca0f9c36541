"""The residency benchmark's oracle and workload (``bench/residency``): pure pieces whose
mistakes would skew every comparison silently."""

from __future__ import annotations

import attrs
from twisted.trial.unittest import SynchronousTestCase

from bench.residency.client import Record
from bench.residency.report import markdown, percentile, pooled
from bench.residency.routers import EngineSettings, LeastBusy, Oracle, binPack
from bench.residency.workload import Script, Workload


class OracleTests(SynchronousTestCase):
    """Static bin-packing by popularity."""

    def test_everyModelPlacedPopularOnesTwice(self) -> None:
        """Five Zipf models on three nodes of two places: each once, the most popular a
        second time, no node over its places nor holding a model twice."""
        held = binPack(Workload().popularity(), 3, 2)
        self.assertEqual(sorted(m for models in held for m in models), [0, 0, 1, 2, 3, 4])
        for models in held:
            self.assertLessEqual(len(models), 2)
            self.assertEqual(len(set(models)), len(models))

    def test_moreModelsThanPlaces(self) -> None:
        """Beyond the places, the tail still has a node (it swaps in there)."""
        held = binPack(Workload(models=8).popularity(), 2, 2)
        self.assertEqual(sorted(m for models in held for m in models), list(range(8)))

    def test_routesToAssignedLeastBusy(self) -> None:
        """A request goes to the least busy node its model is assigned to."""
        oracle = Oracle(["a", "b"], ["x", "y"], [[0, 1], [0]])
        self.assertEqual({oracle.choose("x"), oracle.choose("x")}, {"a", "b"})
        self.assertEqual(oracle.choose("y"), "a")
        balancer = LeastBusy(["a", "b"])
        first = balancer.choose("x")
        self.assertNotEqual(balancer.choose("x"), first)
        balancer.ended(first, "x")
        self.assertEqual(balancer.inFlight[first], 0)


class WorkloadTests(SynchronousTestCase):
    """The seeded Zipf workload."""

    def test_seededZipf(self) -> None:
        """Shares fall with rank; the same seed gives the same choices."""
        shares = Workload().popularity()
        self.assertAlmostEqual(sum(shares), 1.0)
        self.assertEqual(shares, sorted(shares, reverse=True))
        one, two = Script(Workload(), 3), Script(Workload(), 3)
        self.assertEqual([one.next() for _ in range(20)], [two.next() for _ in range(20)])
        self.assertEqual(percentile([3.0, 1.0, 2.0], 0.5), 2.0)
        self.assertIsNone(percentile([], 0.9))


def _engine(loads: int, evictions: int) -> dict[str, object]:
    return {"residency": {"loads": loads, "evictions": evictions, "loaded": []}, "completed": 1}


class PooledTests(SynchronousTestCase):
    """Several seeded runs of one router as one summary, and the section saying it."""

    def test_quantilesOverEveryRequest(self) -> None:
        """The TTFT quantiles are over the requests of every run, not a mean of the runs':
        two runs each with one slow request in ten pool to a fast p90 only where the slow
        ones stay under a tenth; loads and evictions stay per run."""
        fast = [Record(0, "m", ttft=0.02) for _ in range(18)]
        slow = [Record(0, "m", ttft=3.0) for _ in range(2)]
        one = pooled(
            [(fast[:9] + slow[:1], [_engine(3, 0)]), (fast[9:] + slow[1:], [_engine(4, 1)])]
        )
        self.assertEqual(one["requests"], 20)
        self.assertEqual(one["ttft"]["p90"], 0.02)
        self.assertEqual(one["ttft"]["p99"], 3.0)
        self.assertEqual((one["loadsPerRun"], one["evictionsPerRun"]), ([3, 4], [0, 1]))
        self.assertEqual((one["loads"], one["evictions"]), (7, 1))
        self.assertNotIn("perEngine", one)
        worse = pooled([(fast[:8] + slow, [_engine(3, 0)]), (fast[8:10], [_engine(3, 0)])])
        self.assertEqual(worse["ttft"]["p90"], 3.0)

    def test_sectionGivesRatiosAndEachRun(self) -> None:
        """With several runs the section says the seeds, each router's p90 over the
        oracle's, pooled and per seed."""

        def summary(p90: float) -> dict[str, object]:
            return pooled([([Record(0, "m", ttft=p90)], [_engine(6, 0)])])

        results = {
            "date": "d",
            "command": "c",
            "machine": "m",
            "workload": attrs.asdict(Workload(seed=3)),
            "engines": {"count": 3, **attrs.asdict(EngineSettings())},
            "runs": [
                {"seed": 3, "routers": {"oracle": summary(0.02), "nvpair": summary(0.03)}},
                {"seed": 4, "routers": {"oracle": summary(0.04), "nvpair": summary(0.04)}},
            ],
            "routers": {"oracle": summary(0.025), "nvpair": summary(0.025)},
        }
        text = markdown(results)
        self.assertIn("2 runs, seeds 3–4", text)
        self.assertIn("| 3 | 0.020 s (1.00×) | 0.030 s (1.50×) |", text)
        self.assertIn("| 4 | 0.040 s (1.00×) | 0.040 s (1.00×) |", text)
        self.assertRegex(text, r"nvpair-proxy.*\| 6 \| 0 \|.*\| 1\.00× \|")
