"""Admission by predicted wait, the arithmetic (``flow.predicted``)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.flow.predicted import (
    MIN_RUNNING,
    SERVICE_SAMPLES,
    allKept,
    bound,
    ceilingRate,
    keptInTime,
    serviceRate,
)


def waiting(least: int) -> tuple[st.SearchStrategy[Any], ...]:
    """Since when each of at least ``least`` requests waits, now, a drain rate, a timeout."""
    return (
        st.lists(st.floats(0.0, 100.0), min_size=least, max_size=50),
        st.floats(100.0, 200.0),
        st.floats(0.01, 50.0),
        st.floats(1.0, 120.0),
    )


class PredictedTests(SynchronousTestCase):
    """What a queue lets in and keeps once it knows how fast it drains."""

    def test_serviceRate(self) -> None:
        """Each owner's capacity over its service time, summed; unknown when any owner's
        is, or when fewer than ``SERVICE_SAMPLES`` requests were seen in all."""
        self.assertEqual(serviceRate([(1, 1.0, 1), (2, 0.5, 1)]), 5.0)
        self.assertIsNone(serviceRate([(1, 1.0, SERVICE_SAMPLES - 1)]))
        self.assertIsNone(serviceRate([(1, 1.0, 5), (None, 1.0, 5)]))
        self.assertIsNone(serviceRate([(1, None, 5)]))
        self.assertIsNone(serviceRate([(0, 1.0, 5)]))

    def test_ceilingRate(self) -> None:
        """Before any request ended: each owner's capacity over how long its first running
        request has run, summed (a ceiling); unknown while any is unknown or younger than
        ``MIN_RUNNING``."""
        self.assertEqual(ceilingRate([(1, 0.5), (2, 1.0)]), 4.0)
        self.assertIsNone(ceilingRate([(1, 0.5), (1, None)]))
        self.assertIsNone(ceilingRate([(None, 0.5)]))
        self.assertIsNone(ceilingRate([(1, MIN_RUNNING / 2)]))
        self.assertIsNone(ceilingRate([]))

    def test_bound(self) -> None:
        """Unknown rate: ``--queue-max``; known: the requests that start within the
        timeout (the k-th at k / rate), at least one, at most ``--queue-max``."""
        self.assertEqual(bound(None, 30.0, 256), 256)
        self.assertEqual(bound(2.0, 30.0, 256), 59)
        self.assertEqual(bound(100.0, 30.0, 256), 256)
        self.assertEqual(bound(0.001, 30.0, 256), 1)

    @given(*waiting(0))
    def test_keptStartInTime(
        self, since: list[float], now: float, rate: float, timeout: float
    ) -> None:
        """The oldest ``keep`` each start before their time is up; one more would not."""
        keep = keptInTime(since, now, rate, timeout)
        ordered = sorted(since)
        self.assertTrue(0 <= keep <= len(since))
        for position in range(1, keep + 1):
            self.assertLess(now + position / rate, ordered[position - 1] + timeout)
        if keep < len(since):
            self.assertGreaterEqual(now + (keep + 1) / rate, ordered[keep] + timeout)

    @given(*waiting(1))
    def test_allKeptNeverWrong(
        self, since: list[float], now: float, rate: float, timeout: float
    ) -> None:
        """Where the cheap test says every request is kept, ``keptInTime`` keeps them all."""
        if allKept(min(since), len(since), now, rate, timeout):
            self.assertEqual(keptInTime(since, now, rate, timeout), len(since))

    def test_allKept(self) -> None:
        """The last in line starting in time, even with the oldest's start, keeps all."""
        self.assertTrue(allKept(100.0, 10, 110.0, 1.0, 30.0))  # 120 < 130
        self.assertFalse(allKept(100.0, 20, 110.0, 1.0, 30.0))  # 130 is not < 130
        self.assertTrue(allKept(float("inf"), 0, 110.0, 1.0, 30.0))  # nothing waits
