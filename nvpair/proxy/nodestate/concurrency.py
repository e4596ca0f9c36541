"""How many requests an engine that reports no slots serves at once, learnt (spec §11).

Ollama never says how many requests a loaded model runs in parallel
(``OLLAMA_NUM_PARALLEL``) and never answers "busy" until its queue of 512 is full: a
request beyond its parallel slots waits inside the engine for a whole answer to end.  So
the wait before the first byte tells: requests started while *k* of ours ran on the node
(this one included) that waited about as long as when few ran were served at once; from
the level where the wait rises, they queued.

``observe(node, running, firstByte, work)``: a request started while ``running`` of ours
ran there got its first byte after ``firstByte`` seconds, of which ``work`` the engine says
it spent working (prompt evaluation and load, when reported: Ollama's
``prompt_eval_duration`` and ``load_duration``; 0 when not). Its *wait* is the rest. Per
level *k* (1 to ``MAX_LEVEL``) the waits' moving average (weight ``WEIGHT``); the
*baseline* is the lowest level average with ``MIN_SAMPLES`` samples; a level has *risen*
when its average exceeds ``RISE_FACTOR`` × baseline + a slack: ``RISE_SLACK`` seconds, or
``RISE_SHARE`` of the node's service time (how long ours hold a slot there, as the room
ledger measures it) where that is less, but at least ``RISE_FLOOR`` (a queued request waits
until one of the running answers ends: about that answer's remaining time, far beyond
jitter; on an engine whose answers take a fraction of a second, a fraction of
``RISE_SLACK``; on one answering in milliseconds, jitter under load is more than that). The
estimate is one below the lowest risen level with ``MIN_SAMPLES`` samples (at least 1);
with none risen, None (no limit seen yet). A level not sampled for ``FORGET_AFTER`` seconds
is forgotten, so a limit lapses unless traffic confirms it (and the engine may have been
restarted with another setting). The estimate is read on every room check: it is reckoned
again after a sample, else at most every ``REUSE`` seconds. Pure, on a clock, at most
``maxNodes`` nodes of ``MAX_LEVEL`` levels.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime

__all__ = ["ConcurrencyEstimator"]

MAX_LEVEL = 64
MIN_SAMPLES = 2
WEIGHT = 0.25
RISE_FACTOR = 2.0
RISE_SLACK = 0.1
RISE_SHARE = 0.125  # of the node's service time: the slack where that is less than RISE_SLACK
RISE_FLOOR = 0.04  # seconds: the least slack, however fast the engine (jitter under load)
FORGET_AFTER = 600.0
MAX_NODES = 1024
REUSE = 1.0  # seconds an estimate is reused while no sample comes


def _unknown(nodeId: str) -> float | None:
    return None


class _Level:
    __slots__ = ("average", "samples", "at")

    def __init__(self, wait: float, at: float) -> None:
        self.average = wait
        self.samples = 1
        self.at = at


def _baseline(levels: dict[int, _Level], now: float) -> float:
    """The lowest average wait of a level with ``MIN_SAMPLES`` samples that is not stale
    (infinity when there is none)."""
    baseline = math.inf
    for level in levels.values():
        if (
            level.samples >= MIN_SAMPLES
            and level.average < baseline
            and now - level.at <= FORGET_AFTER
        ):
            baseline = level.average
    return baseline


class ConcurrencyEstimator:
    """Learnt parallel slots per node (the module docstring says the rule)."""

    def __init__(
        self,
        clock: IReactorTime,
        maxNodes: int = MAX_NODES,
        service: Callable[[str], float | None] | None = None,
    ) -> None:
        self.clock = clock
        self.maxNodes = maxNodes
        self.service = service or _unknown  # a node's service time (``IRoomLedger.serviceTime``)
        self._nodes: dict[str, dict[int, _Level]] = {}
        self._learnt: dict[str, tuple[int | None, float]] = {}  # (estimate, when), per node

    def observe(self, nodeId: str, running: int, firstByte: float, work: float = 0.0) -> None:
        """A request started with ``running`` of ours on ``nodeId`` (itself included) had
        its first byte after ``firstByte`` s, ``work`` s of it the engine's own work."""
        if not (1 <= running <= MAX_LEVEL) or not math.isfinite(firstByte - work):
            return
        wait = firstByte - work if work > 0.0 else firstByte
        if not wait > 0.0:
            wait = 0.0  # as ``max(0.0, wait)``, without the call
        levels = self._nodes.get(nodeId)
        if levels is None:
            if len(self._nodes) >= self.maxNodes:
                return
            levels = self._nodes[nodeId] = {}
        now = self.clock.seconds()
        self._learnt.pop(nodeId, None)
        level = levels.get(running)
        if level is None:
            levels[running] = _Level(wait, now)
            return
        level.average += WEIGHT * (wait - level.average)
        level.samples += 1
        level.at = now

    def learnt(self, nodeId: str) -> int | None:
        """How many requests ``nodeId`` serves at once, or None while no rise was seen."""
        levels = self._nodes.get(nodeId)
        if not levels:
            return None
        now = self.clock.seconds()
        cached = self._learnt.get(nodeId)
        if cached is not None and now - cached[1] < REUSE:
            return cached[0]  # read on every room check: reckoned at most once a second
        learnt = self._reckon(levels, now, self._slack(nodeId))
        self._learnt[nodeId] = (learnt, now)
        return learnt

    def queued(self, nodeId: str, wait: float) -> float:
        """Of a request's ``wait`` on ``nodeId`` (as ``observe`` takes it), the seconds it
        queued inside the engine for a slot: what exceeds the baseline, when the wait is
        over the level a rise is told by (``RISE_FACTOR`` × baseline + the slack); else 0,
        and 0 while no level has a baseline."""
        levels = self._nodes.get(nodeId)
        baseline = math.inf if levels is None else _baseline(levels, self.clock.seconds())
        if baseline == math.inf or wait <= RISE_FACTOR * baseline + self._slack(nodeId):
            return 0.0
        return wait - baseline

    def _slack(self, nodeId: str) -> float:
        service = self.service(nodeId)
        if service is None:
            return RISE_SLACK
        return min(RISE_SLACK, max(RISE_FLOOR, RISE_SHARE * service))

    def _reckon(self, levels: dict[int, _Level], now: float, slack: float) -> int | None:
        # Reckoned after every sample: plain loops, nothing sorted (the lowest risen level
        # is a min; with no level known, nothing rises above infinity).
        limit = RISE_FACTOR * _baseline(levels, now) + slack
        for k in [k for k, level in levels.items() if now - level.at > FORGET_AFTER]:
            del levels[k]
        risen: int | None = None
        for k, level in levels.items():
            if level.samples >= MIN_SAMPLES and level.average > limit:
                if risen is None or k < risen:
                    risen = k
        return None if risen is None else max(1, risen - 1)

    def forget(self, nodeId: str) -> None:
        """``nodeId`` left the fleet."""
        self._nodes.pop(nodeId, None)
        self._learnt.pop(nodeId, None)

    def snapshot(self, nodeId: str) -> dict[str, object]:
        """``/status``: the learnt limit and each level's average wait and samples."""
        learnt = self.learnt(nodeId)
        levels = self._nodes.get(nodeId, {})
        return {
            "learnt": learnt,
            "levels": {
                str(k): {"waitSeconds": round(lv.average, 3), "samples": lv.samples}
                for k, lv in sorted(levels.items())
            },
        }
