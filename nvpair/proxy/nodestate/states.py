"""The engines' own state as standalone mode last read it (spec §11.2): ``IEngineStates``.

The poller (``facade.enginepoller``) records each probe here: a report, or a failure.  A
node's state is *fresh* while its last probe succeeded and is at most two probe intervals
old; otherwise it is unknown (every reader gets ``None``), never idle.  How much room a node
has is not kept here but in the room ledger (``nodestate.ledger``), which the poller feeds
the same reports; ``status`` shows both.  Also kept per node: the prompt and cached-prompt
tokens its answers reported (its cache-hit ratio), its prefill time per token, and whether
its prompt cache moves saved prompts (the engine's identity probe, asked once).
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nvpair.proxy.nodestate.interfaces import IEngineStates, IResidency, IRoomLedger
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.table import MAX_NODES

__all__ = ["EngineStates"]

MIN_EVALUATED = 32  # prompt tokens evaluated at least, for a prefill time per token
PREFILL_WEIGHT = 0.25  # weight of the newest request in the prefill time's moving average


class _State:
    __slots__ = ("report", "at", "interval", "problem", "probe")

    def __init__(self) -> None:
        self.report: EngineReport | None = None
        self.at = 0.0
        self.interval = 0.0
        self.problem = "not probed yet"
        self.probe = ""


class CacheCounts:
    """Prompt tokens an engine's answers reported, and how many of them it had cached."""

    __slots__ = ("prompt", "cached")

    def __init__(self) -> None:
        self.prompt = 0
        self.cached = 0


@implementer(IEngineStates)
class EngineStates:
    """Each backend's latest probe and reported cache figures, bounded to ``maxNodes``;
    ``ledger`` is the room ledger ``status`` shows beside them."""

    def __init__(self, clock: IReactorTime, ledger: IRoomLedger, maxNodes: int = MAX_NODES) -> None:
        self.clock = clock
        self.ledger = ledger
        self.maxNodes = maxNodes
        self._states: dict[str, _State] = {}
        self.cache: dict[str, CacheCounts] = {}  # what each node's engine reported
        self.prefill: dict[str, float] = {}  # node -> prefill ms per evaluated token (EWMA)
        self.moving: dict[str, bool] = {}  # node -> whether its prompt cache moves (identity)
        self.residency: IResidency | None = None  # which models each node holds (standalone)

    def served(self, nodeId: str, prompt: int, cached: int, promptMs: float | None = None) -> None:
        """The engine of ``nodeId`` reported ``cached`` of ``prompt`` prompt tokens cached,
        and evaluating the rest took ``promptMs`` milliseconds (None: not reported)."""
        counts = self.cache.get(nodeId)
        if counts is None:
            if len(self.cache) >= self.maxNodes:
                return
            counts = self.cache[nodeId] = CacheCounts()
        counts.prompt += prompt
        counts.cached += cached
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
        if counts is None or counts.prompt <= 0:
            return None
        return counts.cached / counts.prompt

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
        state.problem = problem
        state.probe = probe

    def identified(self, nodeId: str, moves: bool) -> None:
        """The identity probe of ``nodeId`` answered: whether its prompt cache moves."""
        if nodeId in self.moving or len(self.moving) < self.maxNodes:
            self.moving[nodeId] = moves

    def identity(self, nodeId: str) -> bool | None:
        """What the identity probe of ``nodeId`` said, or None before it answered."""
        return self.moving.get(nodeId)

    def promptsMove(self, nodeId: str) -> bool:
        return self.moving.get(nodeId, False)

    def forget(self, nodeId: str) -> None:
        """``nodeId`` left its fleet: drop its state and counts."""
        self._states.pop(nodeId, None)
        self.cache.pop(nodeId, None)
        self.prefill.pop(nodeId, None)
        self.moving.pop(nodeId, None)

    def fresh(self, nodeId: str) -> EngineReport | None:
        """The report of ``nodeId``'s last probe if it succeeded within two intervals."""
        state = self._states.get(nodeId)
        if state is None or state.report is None:
            return None
        if self.clock.seconds() - state.at > 2 * state.interval:
            return None
        return state.report

    def modelLoaded(self, nodeId: str, model: str) -> bool | None:
        report = self.fresh(nodeId)
        if report is None or report.loaded is None:
            return None
        return model in report.loaded

    def status(self) -> dict[str, dict[str, object]]:
        """The ``/status`` view: per node, its probe (state, age, problem), slots busy and
        total as reported, the room ledger's view, loaded models, cache figures."""
        now = self.clock.seconds()
        ledger = self.ledger
        out: dict[str, dict[str, object]] = {}
        for nodeId in sorted(set(self._states) | set(self.cache)):
            state = self._states.get(nodeId)
            report = self.fresh(nodeId)
            entry: dict[str, object] = {"state": "fresh" if report is not None else "unknown"}
            if state is not None:
                entry["ageSeconds"] = round(now - state.at, 3)
                entry["probe"] = state.probe
                if state.problem:
                    entry["problem"] = state.problem
            if report is not None:
                entry["slotsBusy"] = report.busy
                entry["slotsTotal"] = report.total
                if report.loaded is not None:
                    entry["loaded"] = sorted(report.loaded)
                if report.expires:
                    entry["loadedUntil"] = dict(report.expires)
            entry.update(ledger.status(nodeId))
            counts = self.cache.get(nodeId)
            if counts is not None:
                entry.update(_cacheStatus(counts, self.prefill.get(nodeId)))
            if self.moving.get(nodeId):
                entry["promptCache"] = "moves"
            out[nodeId] = entry
        return out


def _cacheStatus(counts: CacheCounts, prefill: float | None) -> dict[str, object]:
    prompt, cached = counts.prompt, counts.cached
    out: dict[str, object] = {
        "promptTokens": prompt,
        "cachedTokens": cached,
        "cacheHitRatio": round(cached / prompt, 4) if prompt else None,
    }
    if prefill is not None:
        out["prefillMsPerToken"] = round(prefill, 4)
    return out
