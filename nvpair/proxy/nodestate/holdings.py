"""What the residency view keeps of each node (``residency.Residency``; spec §11, "Model
residency"), bounded: ``MAX_MODELS`` models per node in each table, ``MAX_EVENTS`` events."""

from __future__ import annotations

import datetime
from collections import deque

from nvpair.proxy.nodestate.demand import Demand
from nvpair.proxy.nodestate.probes import ResidentModel

__all__ = ["MAX_EVENTS", "MAX_MODELS", "NodeHoldings", "epoch", "residentBytes"]

MAX_MODELS = 256
MAX_EVENTS = 32


class NodeHoldings:
    """What the residency view keeps of one node: its resident models, loads expected,
    our requests there, its loads and evictions seen (``residency.Residency``)."""

    __slots__ = ("resident", "since", "loadingSince", "seen", "installed", "capacity",
                 "memory", "counts", "events", "asked", "expected", "done", "running", "used",
                 "demand")  # fmt: skip

    def __init__(self) -> None:
        self.resident: dict[str, ResidentModel] = {}
        self.since: dict[str, float] = {}  # resident model -> when it appeared
        self.loadingSince: dict[str, float] = {}  # model seen loading -> since when
        self.seen = False  # a probe listing models was read
        self.installed: int | None = None
        self.capacity = 0  # most models seen resident at once
        self.memory = 0  # most bytes seen resident at once (sizes reported)
        self.counts = {"loads": 0, "evictions": 0, "expired": 0, "unloaded": 0}
        self.events: deque[tuple[float, str, str]] = deque(maxlen=MAX_EVENTS)
        self.asked: dict[str, float] = {}  # model -> when we asked to unload it
        self.expected: dict[str, float] = {}  # model -> when we started its load
        self.done: dict[str, float] = {}  # model -> when a load was seen done, until listed
        self.running: dict[str, int] = {}
        self.used: dict[str, float] = {}  # model -> our last request on it
        self.demand = Demand(MAX_MODELS)


def epoch(until: str | None) -> float | None:
    """An engine's ``expires_at`` as epoch seconds (None: absent or not a time)."""
    if until is None:
        return None
    try:
        return datetime.datetime.fromisoformat(until).timestamp()
    except (ValueError, OverflowError):
        return None


def residentBytes(model: ResidentModel) -> int | None:
    """The bytes ``model`` takes (in video memory where the engine says), if reported."""
    return model.vramBytes if model.vramBytes else model.sizeBytes
