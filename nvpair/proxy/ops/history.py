"""The last 15 minutes of traffic, per facade and per node, in fixed-size ring buffers.

A :class:`Window` is one series: ``BUCKETS`` buckets of ``BUCKET_SECONDS`` each, held in
preallocated lists indexed by ``bucket % BUCKETS``.  Each slot remembers which bucket it
holds; a slot is cleared when a later bucket claims it, and a slot holding a bucket older
than the window reads as empty, so no timer runs and an idle series costs nothing.  Time to
first token goes into a small fixed histogram per bucket (median estimated from it), error
reasons into at most ``MAX_REASONS`` rows per series (the rest count as ``other``).  Memory
is therefore constant whatever the load; the number of node series is capped too.

:class:`History` is fed once per workload end (:meth:`History.ended`) and once per attempt
outcome (:meth:`History.attempt`): a few list increments and a small tuple or two; lists are
allocated only for a new series or error reason, and cleared only when a bucket rolls over.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from operator import add

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nvpair.proxy.broker.workloads import IWorkloadEnds
from nvpair.proxy.ops.documents import FacadeHistory, HistoryDocument, Series

BUCKET_SECONDS = 10
BUCKETS = 90  # 15 minutes
MAX_REASONS = 8
MAX_NODE_SERIES = 256
OTHER = "other"
# Upper bounds (ms) of the time-to-first-token bins; one more bin holds everything above.
TTFT_BOUNDS_MS = (
    1,
    2,
    5,
    10,
    20,
    35,
    50,
    75,
    100,
    150,
    200,
    300,
    500,
    750,
    1000,
    1500,
    2000,
    3000,
    5000,
    7500,
    10000,
    15000,
    30000,
    60000,
)
_BINS = len(TTFT_BOUNDS_MS) + 1
# Outcomes of an attempt that say nothing about the node's health.
_UNINFORMATIVE = frozenset({"left", "moved"})


def median(counts: list[int]) -> float | None:
    """The median (ms) of a TTFT histogram, interpolated inside the bin holding it."""
    total = sum(counts)
    if not total:
        return None
    rank = total / 2
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index == len(TTFT_BOUNDS_MS):
                return float(TTFT_BOUNDS_MS[-1])
            low = TTFT_BOUNDS_MS[index - 1] if index else 0
            high = TTFT_BOUNDS_MS[index]
            return round(low + (high - low) * (rank - seen) / count, 1)
        seen += count
    return None  # pragma: no cover (the loop always reaches the rank)


def measures(stats: Mapping[str, object] | None) -> tuple[int, int]:
    """(TTFT bin or -1, completion tokens) of a workload's statistics; a value that is not a
    number (or is a bool, or a negative count) is left out."""
    if not stats:
        return -1, 0
    ttft = stats.get("ttftMs")
    tokens = stats.get("completionTokens")
    ttftBin = -1
    if type(ttft) is int or type(ttft) is float:
        ttftBin = bisect_left(TTFT_BOUNDS_MS, ttft)
    return ttftBin, tokens if type(tokens) is int and tokens > 0 else 0


class Window:
    """One series of ``BUCKETS`` buckets: ended workloads, tokens, TTFT bins, errors by reason."""

    __slots__ = (
        "stamps",
        "requests",
        "completed",
        "cancelled",
        "failed",
        "tokens",
        "ttft",
        "reasons",
        "last",
        "medians",
    )

    def __init__(self) -> None:
        self.stamps = [-1] * BUCKETS
        self.requests = [0] * BUCKETS
        self.completed = [0] * BUCKETS
        self.cancelled = [0] * BUCKETS
        self.failed = [0] * BUCKETS
        self.tokens = [0] * BUCKETS
        self.ttft = [0] * (BUCKETS * _BINS)
        self.reasons: dict[str, list[int]] = {}
        self.last = -1  # the newest bucket written
        # Per slot, (bucket, TTFT median) once that bucket is over (it can no longer change).
        self.medians: list[tuple[int, float | None]] = [(-1, None)] * BUCKETS

    def slot(self, bucket: int) -> int:
        """The slot of ``bucket``, cleared first if it held an older bucket."""
        index = bucket % BUCKETS
        if self.stamps[index] != bucket:
            self._claim(index, bucket)
        return index

    def _claim(self, index: int, bucket: int) -> None:
        """Give slot ``index`` to ``bucket``, empty (a reason row left all zero is dropped)."""
        self.stamps[index] = bucket
        self.requests[index] = self.completed[index] = self.cancelled[index] = 0
        self.failed[index] = self.tokens[index] = 0
        start = index * _BINS
        self.ttft[start : start + _BINS] = _ZEROS
        for reason, row in list(self.reasons.items()):
            row[index] = 0
            if not any(row):
                del self.reasons[reason]
        if bucket > self.last:
            self.last = bucket

    def error(self, index: int, reason: str) -> None:
        """Count one error for ``reason`` in slot ``index``."""
        row = self.reasons.get(reason)
        if row is None:
            if len(self.reasons) >= MAX_REASONS - 1 and reason != OTHER:
                reason = OTHER
            row = self.reasons.get(reason)
            if row is None:
                row = self.reasons[reason] = [0] * BUCKETS
        row[index] += 1

    def count(self, bucket: int, state: str, error: str | None, ttftBin: int, tokens: int) -> None:
        """Count one request that ended in ``bucket``: its terminal state (a failure by its
        ``error``), its TTFT bin (-1: none) and completion tokens (see :func:`measures`)."""
        index = bucket % BUCKETS
        if self.stamps[index] != bucket:
            self._claim(index, bucket)
        self.requests[index] += 1
        if state == "completed":
            self.completed[index] += 1
        elif state == "cancelled":
            self.cancelled[index] += 1
        else:
            self.failed[index] += 1
            self.error(index, error or "unknown")
        if ttftBin >= 0:
            self.ttft[index * _BINS + ttftBin] += 1
        if tokens:
            self.tokens[index] += tokens

    def document(self, current: int) -> Series:
        """The series over the buckets ``current - BUCKETS + 1`` to ``current``, oldest first."""
        live = [
            (b % BUCKETS if self.stamps[b % BUCKETS] == b else -1)
            for b in range(current - BUCKETS + 1, current + 1)
        ]
        start = (current + 1) % BUCKETS  # the slot of the oldest bucket shown
        dead = [position for position, i in enumerate(live) if i < 0]

        def column(values: list[int]) -> list[int]:
            rotated = values[start:] + values[:start]
            for position in dead:
                rotated[position] = 0
            return rotated

        ttftTotal = [0] * _BINS
        medians: list[float | None] = []
        ttft, served, stamps, cached = self.ttft, self.requests, self.stamps, self.medians
        for i in live:
            if i < 0 or not served[i]:
                medians.append(None)
                continue
            bins = ttft[i * _BINS : (i + 1) * _BINS]
            ttftTotal = list(map(add, ttftTotal, bins))
            bucket, value = cached[i]
            if bucket != stamps[i]:
                value = median(bins)
                if stamps[i] < current:
                    cached[i] = (stamps[i], value)
            medians.append(value)
        requests, tokens = column(self.requests), column(self.tokens)
        reasons = {r: column(row) for r, row in sorted(self.reasons.items())}
        reasons = {r: row for r, row in reasons.items() if any(row)}
        errors = [sum(c) for c in zip(*reasons.values(), strict=True)] if reasons else [0] * BUCKETS
        return {
            "requests": requests,
            "completed": column(self.completed),
            "failed": column(self.failed),
            "cancelled": column(self.cancelled),
            "requestsPerSecond": [n / BUCKET_SECONDS for n in requests],
            "ttftP50Ms": medians,
            "tokens": tokens,
            "tokensPerSecond": [n / BUCKET_SECONDS for n in tokens],
            "errors": errors,
            "errorsByReason": reasons,
            "totals": {
                "requests": sum(requests),
                "completed": sum(column(self.completed)),
                "failed": sum(column(self.failed)),
                "cancelled": sum(column(self.cancelled)),
                "tokens": sum(tokens),
                "ttftP50Ms": median(ttftTotal),
                "errors": sum(errors),
                "errorsByReason": {r: sum(row) for r, row in reasons.items()},
            },
        }


_ZEROS = [0] * _BINS


@implementer(IWorkloadEnds)
class History:
    """Every series of the process: one per facade, one per (facade, node), bounded."""

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.facades: dict[str, Window] = {}
        self.nodes: dict[tuple[str, str], Window] = {}
        # (facade, node) -> (when, None when it committed or the failure kind, status)
        self.attempts: dict[tuple[str, str], tuple[float, str | None, int | None]] = {}

    def _nodeWindow(self, key: tuple[str, str]) -> Window:
        window = self.nodes.get(key)
        if window is None:
            if len(self.nodes) >= MAX_NODE_SERIES:
                oldest = min(self.nodes, key=lambda k: self.nodes[k].last)
                del self.nodes[oldest]
            window = self.nodes[key] = Window()
        return window

    def ended(
        self,
        engine: str,
        node: str | None,
        served: bool,
        state: str,
        error: str | None,
        stats: dict[str, object] | None,
    ) -> None:
        """One workload ended: count it for its facade, and for its node if it served it."""
        bucket = int(self.clock.seconds() // BUCKET_SECONDS)
        ttftBin, tokens = measures(stats)
        window = self.facades.get(engine)
        if window is None:
            window = self.facades[engine] = Window()
        window.count(bucket, state, error, ttftBin, tokens)
        if served and node is not None:
            self._nodeWindow((engine, node)).count(bucket, state, error, ttftBin, tokens)

    def attempt(self, engine: str, node: str, kind: str | None, status: int | None) -> None:
        """An attempt on ``node`` committed (``kind`` None) or failed uncommitted with ``kind``."""
        if kind in _UNINFORMATIVE:
            return
        now = self.clock.seconds()
        key = (engine, node)
        if key not in self.attempts and len(self.attempts) >= MAX_NODE_SERIES:
            del self.attempts[min(self.attempts, key=lambda k: self.attempts[k][0])]
        self.attempts[key] = (now, kind, status)
        if kind is not None:
            window = self._nodeWindow(key)
            window.error(window.slot(int(now // BUCKET_SECONDS)), f"attempt {kind}")

    def document(self) -> HistoryDocument:
        """The ``/status/history`` JSON: every series over the last ``BUCKETS`` buckets."""
        now = self.clock.seconds()
        current = int(now // BUCKET_SECONDS)
        facades: dict[str, FacadeHistory] = {}
        for engine, window in sorted(self.facades.items()):
            facades[engine] = {"series": window.document(current), "nodes": {}}
        for (engine, node), window in sorted(self.nodes.items()):
            if engine not in facades:
                facades[engine] = {"series": Window().document(current), "nodes": {}}
            facades[engine]["nodes"][node] = window.document(current)
        return {
            "bucketSeconds": BUCKET_SECONDS,
            "buckets": BUCKETS,
            "start": (current - BUCKETS + 1) * BUCKET_SECONDS * 1000,
            "now": int(now * 1000),
            "ttftBoundsMs": list(TTFT_BOUNDS_MS),
            "facades": facades,
        }
