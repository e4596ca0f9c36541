"""The engines' own state as standalone mode last read it (spec §11.2): ``IEngineStates``.

The poller (``facade.enginepoller``) records each probe here: a report, or a failure.  A
node's state is *fresh* while its last probe succeeded and is at most two probe intervals
old; otherwise it is unknown (every reader gets ``None``), never idle.

Our own requests fill the gap between probes: ``availableSlots`` is the reported free slots
minus the reservations this process took on the node since that probe, counted as the rise
of its live reservation count since the probe (never below zero; requests that ended since
the probe do not give slots back: the next probe does).

A backend of the fleet file may carry ``max_concurrency``: its slots when its engine
reports none (Ollama, LM Studio, a llama.cpp server without ``/slots``), a limit that holds
whatever the probes say.  Then ``totalSlots`` is that limit and ``availableSlots`` the limit
less this process's live reservations on the node.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nvpair.proxy.nodestate.interfaces import IEngineStates, IResidency
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.routing.reservations import ReservationMap

__all__ = ["EngineStates"]

MAX_NODES = 1024
MAX_LISTENERS = 64
MIN_EVALUATED = 32  # prompt tokens evaluated at least, for a prefill time per token
PREFILL_WEIGHT = 0.25  # weight of the newest request in the prefill time's moving average


class _State:
    __slots__ = ("report", "at", "interval", "reservedAt", "problem", "probe")

    def __init__(self) -> None:
        self.report: EngineReport | None = None
        self.at = 0.0
        self.interval = 0.0
        self.reservedAt = 0
        self.problem = "not probed yet"
        self.probe = ""


@implementer(IEngineStates)
class EngineStates:
    """Each backend's latest probe, bounded to the backends polled."""

    def __init__(
        self, clock: IReactorTime, reservations: ReservationMap, maxNodes: int = MAX_NODES
    ) -> None:
        self.clock = clock
        self.reservations = reservations
        self.maxNodes = maxNodes
        self._states: dict[str, _State] = {}
        self._listeners: list[Callable[[str], None]] = []
        self.cache: dict[str, list[int]] = {}  # node -> [prompt tokens, cached] reported
        self.prefill: dict[str, float] = {}  # node -> prefill ms per evaluated token (EWMA)
        self.limits: dict[str, int] = {}  # node -> configured slots (``max_concurrency``)
        self.residency: IResidency | None = None  # which models each node holds (standalone)

    def setLimit(self, nodeId: str, limit: int | None) -> None:
        """``nodeId``'s configured slots, for an engine that reports none (None: no limit)."""
        if limit is None:
            self.limits.pop(nodeId, None)
        elif nodeId in self.limits or len(self.limits) < self.maxNodes:
            self.limits[nodeId] = limit

    def served(self, nodeId: str, prompt: int, cached: int, promptMs: float | None = None) -> None:
        """The engine of ``nodeId`` reported ``cached`` of ``prompt`` prompt tokens cached,
        and evaluating the rest took ``promptMs`` milliseconds (None: not reported)."""
        counts = self.cache.get(nodeId)
        if counts is None:
            if len(self.cache) >= self.maxNodes:
                return
            counts = self.cache[nodeId] = [0, 0]
        counts[0] += prompt
        counts[1] += cached
        evaluated = prompt - cached
        if promptMs is not None and promptMs >= 0 and evaluated >= MIN_EVALUATED:
            rate = promptMs / evaluated
            last = self.prefill.get(nodeId)
            self.prefill[nodeId] = rate if last is None else last + PREFILL_WEIGHT * (rate - last)

    def prefillMs(self, nodeId: str) -> float | None:
        """The engine of ``nodeId``'s prefill time per evaluated prompt token (ms, a moving
        average of what it reported), or None before it reported one."""
        return self.prefill.get(nodeId)

    def hitRatio(self, nodeId: str) -> float | None:
        """Cached prompt tokens over prompt tokens the engine of ``nodeId`` reported."""
        counts = self.cache.get(nodeId)
        if counts is None or counts[0] <= 0:
            return None
        return counts[1] / counts[0]

    def record(
        self,
        nodeId: str,
        report: EngineReport | None,
        interval: float,
        probe: str,
        problem: str = "",
    ) -> None:
        """A probe of ``nodeId`` (through ``probe``) ended: ``report``, or None and why."""
        state = self._states.get(nodeId)
        if state is None:
            if len(self._states) >= self.maxNodes:
                return  # more backends than any fleet has: the rest stay unknown
            state = self._states[nodeId] = _State()
        state.report = report
        state.at = self.clock.seconds()
        state.interval = interval
        state.reservedAt = self.reservations.reservedCount(nodeId)
        state.problem = problem
        state.probe = probe
        if report is not None:
            for listener in list(self._listeners):
                listener(nodeId)

    def forget(self, nodeId: str) -> None:
        """``nodeId`` left its fleet: drop its state and counts."""
        self._states.pop(nodeId, None)
        self.cache.pop(nodeId, None)
        self.prefill.pop(nodeId, None)
        self.limits.pop(nodeId, None)

    def fresh(self, nodeId: str) -> EngineReport | None:
        """The report of ``nodeId``'s last probe if it succeeded within two intervals."""
        state = self._states.get(nodeId)
        if state is None or state.report is None:
            return None
        if self.clock.seconds() - state.at > 2 * state.interval:
            return None
        return state.report

    def freeSlots(self, nodeId: str) -> int | None:
        report = self.fresh(nodeId)
        if report is None or report.busy is None or report.total is None:
            return None
        return max(0, report.total - report.busy)

    def totalSlots(self, nodeId: str) -> int | None:
        report = self.fresh(nodeId)
        if report is not None and report.total is not None:
            return report.total
        return self.limits.get(nodeId)

    def availableSlots(self, nodeId: str) -> int | None:
        """Free slots as reported, less the reservations we took on it since that probe;
        for an engine that reports none, its configured limit less our live reservations."""
        return self.roomAndLoaded(nodeId, None)[0]

    def roomAndLoaded(self, nodeId: str, model: str | None) -> tuple[int | None, bool | None]:
        """``availableSlots`` and ``modelLoaded`` (None without a model) in one read."""
        free: int | None = None
        loaded: bool | None = None
        state = self._states.get(nodeId)
        report = None if state is None else state.report
        if state is not None and report is not None:
            if self.clock.seconds() - state.at > 2 * state.interval:
                report = None  # stale: unknown
            elif report.busy is not None and report.total is not None:
                since = self.reservations.reservedCount(nodeId) - state.reservedAt
                free = max(0, report.total - report.busy - max(0, since))
        if report is not None and model is not None and report.loaded is not None:
            loaded = model in report.loaded
        if free is None:
            limit = self.limits.get(nodeId)
            if limit is not None:
                free = max(0, limit - self.reservations.reservedCount(nodeId))
        return free, loaded

    def modelLoaded(self, nodeId: str, model: str) -> bool | None:
        report = self.fresh(nodeId)
        if report is None or report.loaded is None:
            return None
        return model in report.loaded

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        if len(self._listeners) >= MAX_LISTENERS:
            raise ValueError("too many engine-state listeners")
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def status(self) -> dict[str, dict[str, object]]:
        """The ``/status`` view: per node, slots busy/total, loaded models, age, state."""
        now = self.clock.seconds()
        out: dict[str, dict[str, object]] = {}
        for nodeId in sorted(set(self._states) | set(self.cache) | set(self.limits)):
            counts = self.cache.get(nodeId)
            state = self._states.get(nodeId)
            limit = self.limits.get(nodeId)
            if state is None:
                out[nodeId] = {"state": "unknown"}
                if limit is not None:
                    out[nodeId]["slotsLimit"] = limit
                if counts is not None:
                    out[nodeId].update(_cacheStatus(counts, self.prefill.get(nodeId)))
                continue
            report = self.fresh(nodeId)
            entry: dict[str, object] = {
                "state": "fresh" if report is not None else "unknown",
                "ageSeconds": round(now - state.at, 3),
                "probe": state.probe,
            }
            if state.problem:
                entry["problem"] = state.problem
            if limit is not None:
                entry["slotsLimit"] = limit
            if report is not None:
                entry["slotsBusy"] = report.busy
                entry["slotsTotal"] = report.total
                entry["slotsAvailable"] = self.availableSlots(nodeId)
                if report.loaded is not None:
                    entry["loaded"] = sorted(report.loaded)
                if report.expires:
                    entry["loadedUntil"] = dict(report.expires)
            if counts is not None:
                entry.update(_cacheStatus(counts, self.prefill.get(nodeId)))
            out[nodeId] = entry
        return out


def _cacheStatus(counts: list[int], prefill: float | None) -> dict[str, object]:
    prompt, cached = counts
    out: dict[str, object] = {
        "promptTokens": prompt,
        "cachedTokens": cached,
        "cacheHitRatio": round(cached / prompt, 4) if prompt else None,
    }
    if prefill is not None:
        out["prefillMsPerToken"] = round(prefill, 4)
    return out
