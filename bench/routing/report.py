"""The placement benchmark's figures and its section of ``bench/RESULTS.md``."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from bench.routing.client import Record

HEADING = "## Placement: multi-tenant chat"


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def summarize(records: list[Record], stats: list[dict[str, Any]], tenants: int) -> dict[str, Any]:
    """TTFT quantiles, the engines' cache hit ratio, requests and tenants per engine."""
    ttfts = [r.ttft for r in records if r.ttft is not None and not r.error]
    prompt = sum(int(s["prompt_tokens"]) for s in stats)
    cached = sum(int(s["cached_tokens"]) for s in stats)
    names = [str(s["name"]) for s in stats]
    served: dict[int, Counter[str]] = {}
    for r in records:
        if not r.error:
            served.setdefault(r.tenant, Counter())[r.engine] += 1
    homes = Counter(c.most_common(1)[0][0] for c in served.values())
    return {
        "requests": len(records),
        "errors": sum(1 for r in records if r.error),
        "errorKinds": dict(Counter(r.error for r in records if r.error)),
        "ttft": {f"p{q}": percentile(ttfts, q / 100) for q in (50, 90, 99)},
        "hitRatio": cached / prompt if prompt else 0.0,
        "perEngine": [int(s["completed"]) for s in stats],
        "tenantsPerEngine": [homes.get(n, 0) for n in names],
        "tenantsTotal": tenants,
        "queueWaitMsMax": max(
            (float(s["queue"]["wait_ms_max"]) for s in stats if "queue" in s), default=None
        ),
        "queueWaitMsTotal": sum(float(s["queue"]["wait_ms_total"]) for s in stats if "queue" in s),
    }


def statsFromRecords(records: list[Record], names: list[str]) -> list[dict[str, Any]]:
    """Per engine, what its answers reported (prompt and cached tokens, requests served):
    for real engines, which have no ``/sim/stats``; answers from an engine not known (a
    router that does not say) under ``?``."""
    out = []
    unknown = any(r.engine not in names for r in records if not r.error)
    for name in [*names, "?"] if unknown else names:
        mine = [
            r
            for r in records
            if not r.error and (r.engine == name or name == "?" and r.engine not in names)
        ]
        out.append(
            {
                "name": name,
                "prompt_tokens": sum(r.promptTokens for r in mine),
                "cached_tokens": sum(r.cachedTokens or 0 for r in mine),
                "completed": len(mine),
            }
        )
    return out


LABELS = {
    "nvpair-prefix": "nvpair-proxy `--affinity prefix`",
    "nvpair-off": "nvpair-proxy `--affinity off`",
    "nginx": "nginx round robin",
    "random": "random engine per request (client-side)",
    "oracle": "each tenant pinned to one engine (an oracle, not a router)",
    "sglang": "SGLang model gateway (`sglang-router`, `cache_aware`)",
    "smg": "SGLang's successor gateway (`smg`, `cache_aware`)",
    "vllm": "vLLM router (`vllm-router`, `cache_aware`)",
}


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def markdown(results: dict[str, Any]) -> str:
    """The section: settings, then one row per router."""
    w, e = results["workload"], results["engines"]
    direct = results.get("direct")
    title = f"{HEADING}, run of {results['date']}"
    if direct:
        title += f": {direct['slots']} slots held by direct clients on {direct['engines']} engines"
    lines = [
        title,
        "",
        f"Run of {results['date']} by `{results['command']}` ({results['machine']}). "
        f"{w['tenants']} tenants × {w['users']} users × {w['turns']} turns "
        f"(system prompt {w['systemWords']} words, questions {w['questionWords']} words, "
        f"answers {w['answerTokens']} tokens, think time {w['think']} s mean, start spread "
        f"over {w['ramp']} s, seed {w['seed']}): {results['turns']} streamed chat requests per "
        f"router. {e['count']} simulated llama.cpp engines "
        "(`nvpair.proxy.testing.simengine`, fresh for each router), each "
        f"{e['slots']} slots, a prefix cache of {e['cacheTokens']} tokens in blocks of "
        f"{e['blockSize']} (together {results['cacheShare']:.0%} of the working set of "
        f"{results['workingSet']} tokens), prefill {e['prefillMs']} ms per uncached token, "
        f"decode {e['decodeMs']} ms per token. TTFT: request sent → first content chunk. "
        "Cache hits: prompt tokens the engines served from cache over all prompt tokens "
        "(their `/sim/stats`). Tenants per engine: the engine that served most of each "
        "tenant's turns. A turn whose system prompt is not cached pays about "
        f"{w['systemWords'] * e['prefillMs'] / 1000:.2f} s of prefill before its first token; "
        "one whose prompt and history are cached, a few tens of milliseconds.",
        "",
        *routerTable(results, "tenants"),
    ]
    if direct:
        lines += _directTable(results)
    return "\n".join(lines) + "\n"


def routerTable(
    results: dict[str, Any], who: str, labels: dict[str, str] | None = None
) -> list[str]:
    """The table of every router's figures (``who``: what the workload's tenants are;
    ``labels`` over ``LABELS``)."""
    names = {**LABELS, **(labels or {})}
    lines = [
        "| router | TTFT p50 | TTFT p90 | TTFT p99 | prompt tokens from cache "
        f"| requests per engine | {who} per engine | errors | load average (start → end) |",
        "|---|---:|---:|---:|---:|---|---|---:|---|",
    ]
    for name, s in results["routers"].items():
        if "skipped" in s:
            lines.append(f"| {names.get(name, name)} | skipped: {s['skipped']} | | | | | | | |")
            continue
        t = s["ttft"]
        load = s.get("load", [])
        lines.append(
            f"| {names.get(name, name)} | {_s(t['p50'])} | {_s(t['p90'])} | {_s(t['p99'])} "
            f"| {s['hitRatio']:.1%} | {'/'.join(map(str, s['perEngine']))} "
            f"| {'/'.join(map(str, s['tenantsPerEngine']))} | {s['errors']} "
            f"| {' → '.join(f'{x:.0f}' for x in load)} |"
        )
    return lines


def _directTable(results: dict[str, Any]) -> list[str]:
    rows = [(n, s["direct"]) for n, s in results["routers"].items() if "direct" in s]
    if not rows:
        return []
    d0 = rows[0][1]
    lines = [
        "",
        f"Direct clients: the first {results['direct']['engines']} engines had "
        f"{results['direct']['slots']} of their slots held (`POST /sim/hold`) for the whole "
        "run. A turn *waited inside its engine* when the engine's FIFO held it for a slot "
        f"longer than {d0['threshold']:.2f} s (the simulated engine's `X-Sim-Queue-Ms`); "
        "*while another engine had a free slot* when a sample of every engine's `/sim/stats` "
        "(every 0.1 s) taken during that wait showed another engine with a slot free. Short "
        "turns: at most 256 uncached prompt tokens; one service time = answer tokens × decode "
        f"= {d0['serviceTime']:.2f} s. Turns waited in front: held by the router itself "
        f"(a queue, or a hold for the prefix holder) longer than {d0['threshold']:.2f} s.",
        "",
        "| router | turns waited in engine | of them while another engine had a free slot "
        "| share of turns (target ≤ 2 %) | wait p90 | engines' own queue wait, all turns "
        "| turns waited in front | their wait p90 | short turns | short turns' TTFT p90 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in rows:
        total = results["routers"][name].get("queueWaitMsTotal")
        lines.append(
            f"| {LABELS.get(name, name)} | {d['waited']} | {d['waitedWhileFreeElsewhere']} "
            f"| {d['misplacedShare']:.1%} | {_s(d['waitP90'])} "
            f"| {'–' if total is None else f'{total / 1000:.1f} s'} "
            f"| {d.get('waitedInFront', '–')} | {_s(d.get('frontWaitP90'))} | {d['shortTurns']} "
            f"| {_s(d['shortTtftP90'])} |"
        )
    return lines


def writeSection(path: str, section: str, heading: str = HEADING) -> None:
    """Put ``section`` (a dated run) into the results file before the earlier runs of this
    benchmark (those under ``heading``), which are kept: newest first, at the end of the
    file if there is none."""
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    if heading in old:
        before, after = old.split(heading, 1)
        text = before + section + "\n" + heading + after
    else:
        text = old.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)
