"""Admission by predicted wait (spec §11 "The queue", issue 31): pure arithmetic on what a
queue's drain rate lets start before ``--queue-timeout``.

With every owner full, the *k*-th waiting request starts about *k* ÷ rate from now.  A new
request may join while it would start before its own timeout runs out (``bound``); a
waiting one is kept while it still would (``keptInTime``).  The rate is what the queue
has let out (``OBSERVED_SAMPLES`` dispatches at least), else what its owners can take: the
sum of each one's capacity over the time ours hold a slot there, once ``SERVICE_SAMPLES``
of ours ended on them (one request is a guess) (``serviceRate``); before any ended, at most
each one's capacity over how long its first running request has run (``ceilingRate``: a
ceiling, so what it refuses could never have started in time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "MIN_RUNNING",
    "OBSERVED_SAMPLES",
    "SERVICE_SAMPLES",
    "allKept",
    "bound",
    "ceilingRate",
    "keptInTime",
    "serviceRate",
]

OBSERVED_SAMPLES = 8  # dispatches out of a queue before their rate is trusted
SERVICE_SAMPLES = 2  # requests ended on the owners before their service times are
MIN_RUNNING = 0.1  # seconds a first request must have run before its age bounds the rate


def serviceRate(owners: Iterable[tuple[int | None, float | None, int]]) -> float | None:
    """Requests a second the owners can take, from each one's (capacity, service seconds,
    requests seen); None when any is unknown or too few requests were seen."""
    rate = 0.0
    samples = 0
    for capacity, service, seen in owners:
        if capacity is None or not service:
            return None
        rate += capacity / service
        samples += seen
    return rate if rate and samples >= SERVICE_SAMPLES else None


def ceilingRate(owners: Iterable[tuple[int | None, float | None]]) -> float | None:
    """At most how many requests a second the owners can take, from each one's (capacity,
    seconds its first running request has run, none of ours having ended); None when any
    is unknown or too young to say."""
    rate = 0.0
    for capacity, running in owners:
        if capacity is None or running is None or running < MIN_RUNNING:
            return None
        rate += capacity / running
    return rate or None


def bound(rate: float | None, timeout: float, queueMax: int) -> int:
    """How many may wait with a new request among them: ``queueMax``, and with a known
    ``rate`` no more than start before a new request's ``timeout``."""
    if rate is None:
        return queueMax
    return max(1, min(queueMax, math.ceil(rate * timeout) - 1))


def allKept(oldest: float, count: int, now: float, rate: float, timeout: float) -> bool:
    """Whether ``keptInTime`` keeps all ``count`` requests, the oldest waiting since
    ``oldest``, told without sorting: the last starts in time even with the oldest's start
    (each comparison is monotonic, so every earlier one does too)."""
    return now + count / rate < oldest + timeout


def keptInTime(since: Iterable[float], now: float, rate: float, timeout: float) -> int:
    """How many of the requests waiting since ``since`` (any order) can still start before
    their ``timeout`` runs out, taken oldest first."""
    keep = 0
    for position, start in enumerate(sorted(since), 1):
        if now + position / rate >= start + timeout:
            break
        keep = position
    return keep
