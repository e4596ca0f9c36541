"""Tests for nvpair.proxy.ops.history: 15 minutes of 10-second buckets on a Clock, bounded."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.broker.channel import NullSink
from nvpair.proxy.broker.workloads import WorkloadReporter
from nvpair.proxy.ops.documents import Series
from nvpair.proxy.ops.history import (
    BUCKET_SECONDS,
    BUCKETS,
    MAX_NODE_SERIES,
    MAX_REASONS,
    TTFT_BOUNDS_MS,
    History,
    Window,
    measures,
    median,
)

SERIES_KEYS = {
    "requests",
    "completed",
    "failed",
    "cancelled",
    "requestsPerSecond",
    "ttftP50Ms",
    "tokens",
    "tokensPerSecond",
    "errors",
    "errorsByReason",
    "totals",
}


def served(
    history: History,
    node: str = "A",
    ttft: float | None = 40,
    tokens: int = 10,
    state: str = "completed",
    error: str | None = None,
) -> None:
    """One workload that committed on ``node`` ended."""
    stats: dict[str, Any] = {"completionTokens": tokens}
    if ttft is not None:
        stats["ttftMs"] = ttft
    history.ended("llamacpp", node, True, state, error, stats)


def footprint(window: Window) -> int:
    """The bytes held by a window's lists (containers and their slots)."""
    total = sum(
        sys.getsizeof(getattr(window, name))
        for name in ("stamps", "requests", "completed", "cancelled", "failed", "tokens", "ttft")
    )
    return total + sum(sys.getsizeof(row) for row in window.reasons.values())


class BucketTests(SynchronousTestCase):
    """Bucket rollover and the 15-minute window."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)  # a bucket boundary (1e6 is a multiple of 10)
        self.history = History(self.clock)

    def facade(self) -> Series:
        return self.history.document()["facades"]["llamacpp"]["series"]

    def test_sameBucket(self) -> None:
        """Workloads ending within one 10-second bucket count together, in the newest bucket."""
        served(self.history)
        self.clock.advance(BUCKET_SECONDS - 0.01)
        served(self.history)
        series = self.facade()
        self.assertEqual(series["requests"][-1], 2)
        self.assertEqual(sum(series["requests"]), 2)
        self.assertEqual(series["requestsPerSecond"][-1], 0.2)

    def test_rollover(self) -> None:
        """At the boundary a new bucket starts; the older one moves one step back."""
        served(self.history)
        self.clock.advance(BUCKET_SECONDS)
        served(self.history, tokens=30)
        series = self.facade()
        self.assertEqual(series["requests"][-2:], [1, 1])
        self.assertEqual(series["tokens"][-2:], [10, 30])
        self.assertEqual(series["tokensPerSecond"][-2:], [1.0, 3.0])

    def test_fifteenMinutes(self) -> None:
        """A bucket stays visible for 90 buckets (15 minutes), oldest first, then drops out."""
        served(self.history)
        self.clock.advance(BUCKET_SECONDS * (BUCKETS - 1))
        series = self.facade()
        self.assertEqual(series["requests"][0], 1)
        self.assertEqual(series["totals"]["requests"], 1)
        self.clock.advance(BUCKET_SECONDS)
        self.assertEqual(self.facade()["totals"]["requests"], 0)
        self.assertEqual(BUCKETS * BUCKET_SECONDS, 900)

    def test_reusedSlotStartsEmpty(self) -> None:
        """A slot reused 15 minutes later holds only the new bucket's counts."""
        served(self.history, tokens=5)
        self.history.ended("llamacpp", None, False, "failed", "no_owner", None)
        self.clock.advance(BUCKET_SECONDS * BUCKETS)
        served(self.history, tokens=7)
        series = self.facade()
        self.assertEqual(series["requests"][-1], 1)
        self.assertEqual(series["tokens"][-1], 7)
        self.assertEqual(series["totals"]["errors"], 0)
        self.assertEqual(series["errorsByReason"], {})

    def test_idleGap(self) -> None:
        """Buckets nobody wrote in read as zero, and the window's start follows the clock."""
        served(self.history)
        self.clock.advance(BUCKET_SECONDS * 5)
        doc = self.history.document()
        series = doc["facades"]["llamacpp"]["series"]
        self.assertEqual(series["requests"][-6:], [1, 0, 0, 0, 0, 0])
        self.assertEqual(doc["start"], int((self.clock.seconds() - 890) * 1000))
        self.assertEqual(doc["now"], int(self.clock.seconds() * 1000))


class MedianTests(SynchronousTestCase):
    """Time to first token: a fixed histogram per bucket, its median interpolated."""

    def bins(self, *values: float) -> list[int]:
        window = Window()
        for v in values:
            window.count(0, "completed", None, *measures({"ttftMs": v}))
        return window.ttft[: len(TTFT_BOUNDS_MS) + 1]

    def test_singleValue(self) -> None:
        """One value in the (35, 50] bin gives that bin's middle."""
        self.assertEqual(median(self.bins(42)), 42.5)

    def test_rankInsideBin(self) -> None:
        """The median is placed by rank inside the bin that holds it."""
        self.assertEqual(median(self.bins(1, 2, 3, 120, 130, 140, 149, 150)), 110.0)
        self.assertEqual(median(self.bins(120, 130, 140, 149)), 125.0)

    def test_edges(self) -> None:
        """No value: None; beyond the last bound: the last bound; zero: the first bin."""
        self.assertIsNone(median(self.bins()))
        self.assertEqual(median(self.bins(120_000)), 60000.0)
        self.assertEqual(median(self.bins(0)), 0.5)
        self.assertEqual(median(self.bins(3, 4)), 3.5)

    def test_perBucketAndWindow(self) -> None:
        """Each bucket has its median (None when empty); the totals merge the histograms."""
        clock = Clock()
        history = History(clock)
        served(history, ttft=40)
        clock.advance(BUCKET_SECONDS)
        served(history, ttft=400)
        served(history, ttft=None)
        series = history.document()["facades"]["llamacpp"]["series"]
        self.assertEqual(series["ttftP50Ms"][-2:], [42.5, 400.0])
        self.assertEqual(series["ttftP50Ms"][:-2], [None] * (BUCKETS - 2))
        self.assertEqual(series["totals"]["ttftP50Ms"], 50.0)  # rank 1 of 2: the lower value's bin

    def test_mediansFollowTheirBuckets(self) -> None:
        """A bucket still filling has its median recomputed on every read; a reused slot never
        shows the median of the bucket it held before."""
        clock = Clock()
        history = History(clock)

        def newest(count: int) -> list[float | None]:
            series = history.document()["facades"]["llamacpp"]["series"]
            return list(series["ttftP50Ms"][-count:])

        served(history, ttft=40)
        self.assertEqual(newest(1), [42.5])
        served(history, ttft=400)
        served(history, ttft=400)
        self.assertEqual(newest(1), [350.0])  # rank 1.5 of 3: half way into the (300, 500] bin
        clock.advance(BUCKET_SECONDS)
        self.assertEqual(newest(2), [350.0, None])  # the finished bucket's median, kept
        clock.advance(BUCKET_SECONDS * (BUCKETS - 1))
        served(history, ttft=8)  # the first bucket's slot, reused
        clock.advance(BUCKET_SECONDS)
        self.assertEqual(newest(2), [7.5, None])

    def test_badValuesIgnored(self) -> None:
        """A TTFT or token count that is not a number (or is a bool) is not counted."""
        window = Window()
        index = window.slot(0)
        for stats in (
            {"ttftMs": "12", "completionTokens": True},
            {"ttftMs": None, "completionTokens": -3},
        ):
            window.count(0, "completed", None, *measures(stats))
        self.assertEqual(sum(window.ttft), 0)
        self.assertEqual(window.tokens[index], 0)
        self.assertEqual(window.requests[index], 2)


class ErrorTests(SynchronousTestCase):
    """Errors by reason, bounded; cancellations are no errors."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.history = History(self.clock)

    def test_byReason(self) -> None:
        """Failed workloads count by reason for the facade, and for the node that served them."""
        self.history.ended("llamacpp", None, False, "failed", "no_owner", None)
        self.history.ended("llamacpp", "A", False, "failed", "upstream_unreachable", None)
        served(self.history, state="failed", error="upstream status 500")
        served(self.history, state="cancelled", error="client disconnected")
        doc = self.history.document()["facades"]["llamacpp"]
        series = doc["series"]
        self.assertEqual(
            series["totals"]["errorsByReason"],
            {"no_owner": 1, "upstream_unreachable": 1, "upstream status 500": 1},
        )
        self.assertEqual(series["errors"][-1], 3)
        self.assertEqual((series["totals"]["failed"], series["totals"]["cancelled"]), (3, 1))
        node = doc["nodes"]["A"]
        self.assertEqual(node["totals"]["errorsByReason"], {"upstream status 500": 1})
        self.assertEqual(node["totals"]["requests"], 2)

    def test_reasonsCapped(self) -> None:
        """Past ``MAX_REASONS`` distinct reasons in the window, new ones count as ``other``."""
        for i in range(20):
            self.history.ended("llamacpp", None, False, "failed", f"reason {i}", None)
        reasons = self.history.document()["facades"]["llamacpp"]["series"]["errorsByReason"]
        self.assertEqual(len(reasons), MAX_REASONS)
        self.assertEqual(reasons["other"][-1], 20 - (MAX_REASONS - 1))
        self.assertEqual(sum(row[-1] for row in reasons.values()), 20)

    def test_expiredReasonFreesItsRow(self) -> None:
        """A reason whose buckets all left the window gives its row back."""
        self.history.ended("llamacpp", None, False, "failed", "old", None)
        self.clock.advance(BUCKET_SECONDS * BUCKETS)
        self.history.ended("llamacpp", None, False, "failed", "new", None)
        self.assertEqual(set(self.history.facades["llamacpp"].reasons), {"new"})

    def test_attempts(self) -> None:
        """Failed attempts count as node errors by kind; ``left`` is not about the node."""
        self.history.attempt("llamacpp", "B", "transport", None)
        self.history.attempt("llamacpp", "B", "status", 503)
        self.history.attempt("llamacpp", "B", "left", None)
        self.history.attempt("llamacpp", "C", None, None)
        doc = self.history.document()["facades"]["llamacpp"]
        self.assertEqual(
            doc["nodes"]["B"]["totals"]["errorsByReason"],
            {"attempt status": 1, "attempt transport": 1},
        )
        self.assertEqual(doc["nodes"]["B"]["totals"]["requests"], 0)
        self.assertNotIn("C", doc["nodes"])
        self.assertEqual(self.history.attempts[("llamacpp", "B")], (0.0, "status", 503))
        self.assertEqual(self.history.attempts[("llamacpp", "C")], (0.0, None, None))
        self.assertEqual(doc["series"]["totals"]["requests"], 0)


class BoundTests(SynchronousTestCase):
    """Memory is constant whatever the load."""

    def test_windowFootprintBounded(self) -> None:
        """Two hours of heavy traffic with a new error reason every second never grow a window
        past its fixed lists plus ``MAX_REASONS`` reason rows."""
        clock = Clock()
        history = History(clock)
        served(history)
        window = history.facades["llamacpp"]
        fixed = footprint(window)
        bound = fixed + MAX_REASONS * sys.getsizeof([0] * BUCKETS)
        sizes = set()
        for step in range(7200):
            clock.advance(1)
            served(history, ttft=step % 70000, tokens=step)
            history.ended("llamacpp", None, False, "failed", f"reason {step}", None)
            size = footprint(window)
            self.assertLessEqual(size, bound)
            sizes.add(size)
        self.assertIn(bound, sizes)  # the reason rows were used up to the cap
        self.assertEqual(
            footprint(window) - sys.getsizeof([0] * BUCKETS) * len(window.reasons), fixed
        )
        self.assertEqual(len(window.requests), BUCKETS)
        self.assertEqual(len(window.ttft), BUCKETS * (len(TTFT_BOUNDS_MS) + 1))

    def test_nodeSeriesCapped(self) -> None:
        """At most ``MAX_NODE_SERIES`` node series: a new node evicts the least recent."""
        clock = Clock()
        history = History(clock)
        for i in range(MAX_NODE_SERIES + 10):
            clock.advance(BUCKET_SECONDS)
            served(history, node=f"n{i}")
            history.attempt("llamacpp", f"n{i}", None, None)
        self.assertEqual(len(history.nodes), MAX_NODE_SERIES)
        self.assertEqual(len(history.attempts), MAX_NODE_SERIES)
        self.assertNotIn(("llamacpp", "n0"), history.nodes)
        self.assertIn(("llamacpp", f"n{MAX_NODE_SERIES + 9}"), history.nodes)
        self.assertNotIn(("llamacpp", "n9"), history.attempts)


class DocumentTests(SynchronousTestCase):
    """The ``/status/history`` shape."""

    def test_shape(self) -> None:
        """Bucket size and count, TTFT bounds, and per facade a series plus one per node."""
        clock = Clock()
        history = History(clock)
        served(history, node="A")
        history.attempt("ollama", "B", "transport", None)
        doc = history.document()
        self.assertEqual((doc["bucketSeconds"], doc["buckets"]), (10, 90))
        self.assertEqual(doc["ttftBoundsMs"], list(TTFT_BOUNDS_MS))
        self.assertEqual(set(doc["facades"]), {"llamacpp", "ollama"})
        llamacpp = doc["facades"]["llamacpp"]
        self.assertEqual(set(llamacpp), {"series", "nodes"})
        for series in (
            llamacpp["series"],
            llamacpp["nodes"]["A"],
            doc["facades"]["ollama"]["series"],
            doc["facades"]["ollama"]["nodes"]["B"],
        ):
            self.assertEqual(set(series), SERIES_KEYS)
            columns: Mapping[str, object] = series
            for key in SERIES_KEYS - {"errorsByReason", "totals"}:
                column = columns[key]
                assert isinstance(column, list)
                self.assertEqual(len(column), BUCKETS, key)
        self.assertEqual(
            set(llamacpp["series"]["totals"]),
            {
                "requests",
                "completed",
                "failed",
                "cancelled",
                "tokens",
                "ttftP50Ms",
                "errors",
                "errorsByReason",
            },
        )
        self.assertEqual(doc["facades"]["ollama"]["series"]["totals"]["requests"], 0)


class ReporterHookTests(SynchronousTestCase):
    """Every workload end reaches the history, once."""

    def test_finishRecords(self) -> None:
        """A committed workload counts for its facade and node; an unplaced one for its facade;
        a second finish changes nothing."""
        clock = Clock()
        history = History(clock)
        reporter = WorkloadReporter(NullSink(), clock, ends=history)
        done = reporter.admit("ollama", "m")
        done.submitted("N")
        done.started("N")
        done.finish("completed", None, {"ttftMs": 12, "completionTokens": 4})
        done.finish("failed", "internal")
        placed = reporter.admit("ollama", "m")
        placed.submitted("N")
        placed.finish("failed", "upstream_unreachable")
        doc = history.document()["facades"]["ollama"]
        self.assertEqual(doc["series"]["totals"]["requests"], 2)
        self.assertEqual(doc["series"]["totals"]["errorsByReason"], {"upstream_unreachable": 1})
        self.assertEqual(doc["nodes"]["N"]["totals"]["requests"], 1)
        self.assertEqual(doc["nodes"]["N"]["totals"]["tokens"], 4)
