"""The residency benchmark's oracle and workload (``bench/residency``): pure pieces whose
mistakes would skew every comparison silently."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from bench.residency.report import percentile
from bench.residency.routers import LeastBusy, Oracle, binPack
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
