"""How long the queue's requests waited (spec §11 "The queue"): a cumulative histogram in
Prometheus's buckets, per facade and model."""

from __future__ import annotations

__all__ = ["WAIT_BUCKETS", "WaitHistogram"]

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WaitHistogram:
    """Time spent in the queue by the requests it dispatched, cumulative (Prometheus)."""

    __slots__ = ("counts", "total", "count", "last")

    def __init__(self) -> None:
        self.counts = [0] * (len(WAIT_BUCKETS) + 1)
        self.total = 0.0
        self.count = 0
        self.last = 0.0

    def observe(self, seconds: float) -> None:
        """Record one wait."""
        index = 0
        while index < len(WAIT_BUCKETS) and seconds > WAIT_BUCKETS[index]:
            index += 1
        self.counts[index] += 1
        self.total += seconds
        self.count += 1
        self.last = seconds
