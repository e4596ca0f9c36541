"""The direct-clients scenario of the placement benchmark (issue 23's second target).

Some engines' slots are taken by clients that reach them directly, not through the router
(the simulated engine's ``POST /sim/hold {"slots": k}``: held slots are taken as they come
free, before the engine's queue, so only the engine's own state shows them).  While the
workload replays, a thread samples every engine's ``GET /sim/stats`` (slots busy and total,
queue depth) every ``interval`` seconds.

A turn *waited inside its engine* when the engine's FIFO held it for a slot longer than
``threshold`` seconds: the simulated engine says how long in ``X-Sim-Queue-Ms`` (without
it, the time to first token beyond what the engine reported spending on the turn,
``timings.prompt_ms`` and one decode step, counts instead); it waited *while another engine
had a free slot* when, in a sample taken during that wait, another engine had fewer slots
busy than it has.  A turn held in front of the engines (the proxy's queue or a hold for its
prefix holder) waited too, but not inside an engine: those waits are reported apart
(``waitedInFront``, ``frontWaitP90``).  Short turns: those whose uncached part of
the prompt is at most ``SHORT_TOKENS`` tokens; their TTFT p90 is set against one service
time, the time such a turn holds a slot (``answerTokens × decodeMs``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

from bench import procs
from bench.routing.client import Record

SHORT_TOKENS = 256


def hold(engines: list[procs.Server], slots: int) -> None:
    """Take ``slots`` slots of each of ``engines`` as direct clients would."""
    for e in engines:
        request = urllib.request.Request(
            f"http://127.0.0.1:{e.port}/sim/hold",
            data=json.dumps({"slots": slots}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            r.read()


class Sampler:
    """Samples the engines' slots and queues on a thread, with wall-clock times."""

    def __init__(self, engines: list[procs.Server], interval: float = 0.1) -> None:
        self.engines = engines
        self.interval = interval
        self.samples: list[tuple[float, dict[str, tuple[int, int, int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (bounded wait for the thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set() and len(self.samples) < 100_000:
            at = time.time()
            state: dict[str, tuple[int, int, int]] = {}
            for e in self.engines:
                try:
                    url = f"http://127.0.0.1:{e.port}/sim/stats"
                    with urllib.request.urlopen(url, timeout=2) as r:
                        doc = json.loads(r.read())
                    slots = doc["slots"]
                    state[str(doc["name"])] = (
                        int(slots["busy"]),
                        int(slots["total"]),
                        int(doc["queue"]["depth"]),
                    )
                except (OSError, KeyError, ValueError):
                    continue
            self.samples.append((at, state))
            self._stop.wait(self.interval)

    def freeElsewhere(self, engine: str, start: float, end: float) -> bool:
        """Whether, in a sample taken in ``[start, end]`` (or the one nearest to its middle
        if none was), an engine other than ``engine`` had a free slot."""
        inside = [s for at, s in self.samples if start <= at <= end]
        if not inside and self.samples:
            middle = (start + end) / 2
            inside = [min(self.samples, key=lambda sample: abs(sample[0] - middle))[1]]
        return any(
            busy < total for s in inside for name, (busy, total, _) in s.items() if name != engine
        )


def _p90(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(0.9 * len(ordered) + 0.5) - 1))]


def measure(
    records: list[Record],
    sampler: Sampler,
    decodeMs: float,
    answerTokens: int,
    threshold: float,
) -> dict[str, Any]:
    """The scenario's figures from the turns and the samples."""
    served = [r for r in records if not r.error and r.ttft is not None and r.promptMs is not None]
    waited = misplaced = front = 0
    waits: list[float] = []
    fronts: list[float] = []
    misplacedWaits: list[float] = []
    for r in served:
        assert r.ttft is not None and r.promptMs is not None
        total = r.ttft - r.promptMs / 1000.0 - decodeMs / 1000.0
        wait = total if r.queueMs is None else r.queueMs / 1000.0
        before = max(0.0, total - wait)  # in front of the engine: the router's own wait
        waits.append(wait)
        if before > threshold:
            front += 1
            fronts.append(before)
        if wait <= threshold:
            continue
        waited += 1
        if sampler.freeElsewhere(r.engine, r.sent + before, r.sent + before + wait):
            misplaced += 1
            misplacedWaits.append(wait)
    short = [
        r.ttft
        for r in served
        if r.ttft is not None and r.promptTokens - (r.cachedTokens or 0) <= SHORT_TOKENS
    ]
    return {
        "served": len(served),
        "waited": waited,
        "waitedWhileFreeElsewhere": misplaced,
        "misplacedShare": misplaced / len(served) if served else 0.0,
        "misplacedWaitMax": max(misplacedWaits, default=None),
        "misplacedOverSecond": sum(1 for w in misplacedWaits if w > 1.0),
        "waitP90": _p90(waits),
        "waitedInFront": front,
        "frontWaitP90": _p90(fronts),
        "shortTurns": len(short),
        "shortTtftP90": _p90(short),
        "serviceTime": answerTokens * decodeMs / 1000.0,
        "threshold": threshold,
        "samples": len(sampler.samples),
    }
