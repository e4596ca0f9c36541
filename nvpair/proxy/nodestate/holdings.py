"""What the residency view keeps of each node (``residency.Residency``; spec §11, "Model
residency"), bounded: ``MAX_MODELS`` models per node in each table, ``MAX_EVENTS`` events."""

from __future__ import annotations

import datetime
from collections import deque
from collections.abc import Mapping

from nvpair.proxy.nodestate.demand import Demand
from nvpair.proxy.nodestate.probes import LOADED, LOADING, EngineReport, ResidentModel

__all__ = ["ASKED_WINDOW", "EVICTION_SETTLE", "MAX_EVENTS", "MAX_MODELS", "NodeHoldings",
           "epoch", "residentBytes"]  # fmt: skip

MAX_MODELS = 256
MAX_EVENTS = 32
ASKED_WINDOW = 60.0
EVICTION_SETTLE = 0.5  # a probe this long after a load started shows what it evicted


class NodeHoldings:
    """What the residency view keeps of one node: its resident models, loads expected,
    our requests there, its loads and evictions seen (``residency.Residency``)."""

    __slots__ = ("resident", "since", "loadingSince", "seen", "installed", "capacity",
                 "memory", "counts", "events", "asked", "expected", "done", "evicting",
                 "running", "full", "used", "listedAt", "demand")  # fmt: skip

    def __init__(self) -> None:
        self.resident: dict[str, ResidentModel] = {}
        self.since: dict[str, float] = {}  # resident model -> when it appeared
        self.loadingSince: dict[str, float] = {}  # model seen loading -> since when
        self.seen = False  # a probe listing models was read
        self.installed: int | None = None
        self.capacity = 0  # most models seen resident at once
        self.full = False  # an eviction was seen: that many is all it holds, not a lower bound
        self.memory = 0  # most bytes seen resident at once (sizes reported)
        self.counts = {"loads": 0, "evictions": 0, "expired": 0, "unloaded": 0}
        self.events: deque[tuple[float, str, str]] = deque(maxlen=MAX_EVENTS)
        self.asked: dict[str, float] = {}  # model -> when we asked to unload it
        self.expected: dict[str, float] = {}  # model -> when we started its load
        self.done: dict[str, float] = {}  # model -> when a load was seen done, until listed
        self.evicting: dict[str, float] = {}  # model a load of ours will likely evict -> when
        self.listedAt = 0.0  # when a probe last listed what it holds
        self.running: dict[str, int] = {}
        self.used: dict[str, float] = {}  # model -> our last request on it
        self.demand = Demand(MAX_MODELS)

    def event(self, now: float, count: str, model: str, what: str) -> None:
        """A load or an unload seen: counted, and kept among the node's last events."""
        self.counts[count] += 1
        self.events.append((now, what, model))

    def listed(self, report: EngineReport, now: float) -> list[tuple[str, float]]:
        """A fresh probe listing what the node holds (``report.resident``): diff it with
        the previous one (loads and evictions seen, loads seen done, what it can hold);
        the loads seen going from loading to loaded, with their seconds."""
        if report.installed is not None:
            self.installed = len(report.installed)
        new = {r.name: r for r in (report.resident or ())[:MAX_MODELS]}
        measured = []
        for name, model in new.items():
            self.done.pop(name, None)
            old = self.resident.get(name)
            if old is None:
                self.since[name] = now
                if self.seen:
                    self.event(now, "loads", name, "load")
            if model.state == LOADING:
                self.loadingSince.setdefault(name, self.expected.get(name, now))
            elif name in self.loadingSince:
                started = self.loadingSince.pop(name)
                if model.state == LOADED and old is not None and old.state == LOADING:
                    measured.append((name, now - started))
                    self.expected.pop(name, None)
            if report.router and model.state == LOADED:
                self.expected.pop(name, None)  # a router says when a load is done
        for name, old in self.resident.items():
            if name not in new:
                self.since.pop(name, None)
                self.loadingSince.pop(name, None)
                self.gone(now, name, old)
        self.settle(new, now)
        self.resident = new
        self.seen = True
        self.listedAt = now
        self.capacity = max(self.capacity, len(new))
        sizes = [residentBytes(m) for m in new.values()]
        if sizes and all(s is not None for s in sizes):
            self.memory = max(self.memory, sum(s for s in sizes if s is not None))
        return measured

    def gone(self, now: float, name: str, old: ResidentModel) -> None:
        """``name`` is no longer listed: unloaded (we asked within ``ASKED_WINDOW`` s),
        expired (its ``expires_at`` passed) or evicted."""
        asked = self.asked.pop(name, None)
        until = epoch(old.until)
        if asked is not None and now - asked <= ASKED_WINDOW:
            self.event(now, "unloaded", name, "unloaded")
        elif until is not None and 0 < until <= now:  # Go's zero time: not said
            self.event(now, "expired", name, "expired")
        else:
            self.event(now, "evictions", name, "evicted")
            self.full = True

    def settle(self, listed: Mapping[str, object], now: float) -> None:
        """A probe listed ``listed``: a model a load of ours was to evict is gone (it is not
        listed), or was not evicted (still listed ``EVICTION_SETTLE`` s after the load
        started, or after our last request on it ended: the engine had room).  One of our
        requests still running on it (a busy copy draining) keeps the mark."""
        for name, since in list(self.evicting.items()):
            if name not in listed:
                del self.evicting[name]
            elif self.running.get(name):
                self.evicting[name] = now
            elif now - since >= EVICTION_SETTLE:
                del self.evicting[name]


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
