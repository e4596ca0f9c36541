"""The free-slot workload (issue 31, first target): do routed requests wait inside a full
engine while another engine has a free slot?

Simulated llama.cpp engines of a few slots; on the first ``directEngines`` of them a client
that bypasses the router keeps one slot busy with long generations, one after the other
(straight to the engine: only the engine's own state shows it). Through the router,
``longClients`` clients send long generations and ``shortClients`` send short single-turn
requests (each its own prompt: no shared prefix), every client thinking an exponential
time of mean ``think`` seconds between requests. New requests stop after ``duration``
seconds; those in flight finish. Every request is a streamed chat completion.

A thread samples every engine's ``/sim/stats`` every 0.1 s (``direct.Sampler``). A routed
request *waited in its engine* when the engine's ``X-Sim-Queue-Ms`` is above 0; it did so
*while another engine had a free slot* when a sample taken during that wait (or the one
nearest to it) showed another engine with fewer slots busy than it has
(``direct.measure``). Target: at most 2 % of routed requests, none waiting there over 1 s.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from bench.routing.client import Record, Streamer, chatDocument, chatTurn
from bench.routing.direct import Sampler, measure
from bench.routing.report import percentile
from bench.routing.workload import randomText

HEADING = "## Free slot (issue 31)"


@attrs.frozen
class FreeSlotSizes:
    """The free-slot workload's dimensions."""

    directEngines: int = 2
    longClients: int = 2
    shortClients: int = 6
    longTokens: int = 400
    shortTokens: int = 16
    promptWords: int = 60
    think: float = 4.0
    duration: float = 60.0
    seed: int = 1


class FreeSlotClients:
    """The direct, long and short clients; ``choose()`` gives a routed request's base URL."""

    def __init__(
        self,
        reactor: Any,
        choose: Callable[[], str],
        direct: list[str],
        model: str,
        sizes: FreeSlotSizes,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self.clock = IReactorTime(reactor)
        self.choose = choose
        self.direct = direct
        self.model = model
        self.sizes = sizes
        self.streamer = Streamer(reactor, names)
        self.records: list[Record] = []
        self.stopAt = 0.0

    async def run(self) -> list[Record]:
        """Run every client until ``duration`` has passed and its last request ended."""
        s = self.sizes
        self.stopAt = self.clock.seconds() + s.duration
        loops = [self._loop("direct", i, s.longTokens, 0.0) for i in range(len(self.direct))]
        loops += [self._loop("long", i, s.longTokens, s.think) for i in range(s.longClients)]
        loops += [self._loop("short", i, s.shortTokens, s.think) for i in range(s.shortClients)]
        await gatherResults([Deferred.fromCoroutine(loop) for loop in loops])
        await self.streamer.close()
        return self.records

    async def _loop(self, kind: str, index: int, tokens: int, think: float) -> None:
        rng = random.Random(f"{self.sizes.seed}.{kind}.{index}")
        if kind != "direct":  # routed clients start once the direct ones hold their slots
            await deferLater(self.clock, 0.5 + rng.uniform(0, max(think, 0.1)), lambda: None)
        n = 0
        while self.clock.seconds() < self.stopAt:
            record = Record(index, n, 0, kind=kind)
            self.records.append(record)
            prompt = randomText(rng, self.sizes.promptWords, f"{kind}{index}.{n}.")
            doc = chatDocument(self.model, [{"role": "user", "content": prompt}], tokens)
            base = self.direct[index] if kind == "direct" else self.choose()
            answer = await chatTurn(self.streamer, base, doc, record)
            n += 1
            pause = rng.expovariate(1 / think) if think > 0 else 0.0
            if answer is None:
                pause = max(pause, 0.5)  # a refused or failed request: no tight loop
            if pause:
                await deferLater(self.clock, pause, lambda: None)


def summarize(
    records: list[Record], sampler: Sampler, decodeMs: float, sizes: FreeSlotSizes
) -> dict[str, Any]:
    """The routed requests' waits inside engines, their TTFTs, where they went."""
    routed = [r for r in records if r.kind != "direct"]
    waits = measure(routed, sampler, decodeMs, sizes.shortTokens, 0.0)
    out: dict[str, Any] = {
        "requests": len(routed),
        "errors": sum(1 for r in routed if r.error),
        "direct": sum(1 for r in records if r.kind == "direct" and not r.error),
        "perEngine": dict(sorted(Counter(r.engine for r in routed if not r.error).items())),
        "waits": waits,
    }
    for kind in ("short", "long"):
        ttfts = [r.ttft for r in routed if r.kind == kind and r.ttft is not None]
        out[kind] = {
            "requests": sum(1 for r in routed if r.kind == kind),
            "ttft": {f"p{q}": percentile(ttfts, q / 100) for q in (50, 90, 99)},
        }
    return out


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def markdown(results: dict[str, Any], labels: Mapping[str, str]) -> str:
    """The dated section: setup, then one row per router."""
    w, e = results["workload"], results["engines"]
    lines = [
        f"{HEADING}, run of {results['date']}",
        "",
        f"`{results['command']}` ({results['machine']}). {e['count']} simulated llama.cpp "
        f"engines of {e['slots']} slots (prefill {e['prefillMs']} ms per token, decode "
        f"{e['decodeMs']} ms per token), fresh for each router. On {w['directEngines']} of "
        "them a client that bypasses the router keeps one slot busy with generations of "
        f"{w['longTokens']} tokens ({w['longTokens'] * e['decodeMs'] / 1000:.0f} s), one after "
        f"the other. Through the router: {w['longClients']} clients sending such long "
        f"generations and {w['shortClients']} sending short single-turn requests "
        f"({w['promptWords']} words, each its own, {w['shortTokens']} tokens: "
        f"{w['shortTokens'] * e['decodeMs'] / 1000:.1f} s), all thinking {w['think']} s "
        f"(mean, exponential) between requests, for {w['duration']:.0f} s. A routed request "
        "*waited in its engine* when the engine's `X-Sim-Queue-Ms` was above 0; *while another "
        "engine had a free slot* when a sample of every engine's `/sim/stats` (every 0.1 s) "
        "taken during that wait, or the nearest one, showed another engine with a slot free. "
        "Targets: at most 2 % of routed requests, none waiting there more than 1 s.",
        "",
        "| router | routed requests | waited in engine | of them while another had a free "
        "slot | share (≤ 2 %) | longest such wait (≤ 1 s) | such waits over 1 s "
        "| short TTFT p50 | short TTFT p90 | long TTFT p50 | routed per engine | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, s in results["routers"].items():
        label = labels.get(name, name)
        if "skipped" in s:
            lines.append(f"| {label} | skipped: {s['skipped']} |" + " |" * 10)
            continue
        d, short, long = s["waits"], s["short"]["ttft"], s["long"]["ttft"]
        per = " / ".join(f"{k} {v}" for k, v in s["perEngine"].items())
        lines.append(
            f"| {label} | {s['requests']} | {d['waited']} | {d['waitedWhileFreeElsewhere']} "
            f"| {d['misplacedShare']:.1%} | {_s(d['misplacedWaitMax'])} "
            f"| {d['misplacedOverSecond']} | {_s(short['p50'])} | {_s(short['p90'])} "
            f"| {_s(long['p50'])} | {per} | {s['errors']} |"
        )
    nvpair = results["routers"].get("nvpair-prefix")
    if nvpair and "skipped" not in nvpair:
        d = nvpair["waits"]
        ok = d["misplacedShare"] <= 0.02 and d["misplacedOverSecond"] == 0
        lines += ["", f"Targets (issue 31), nvpair-proxy: **{'PASS' if ok else 'FAIL'}**."]
    return "\n".join(lines) + "\n"
