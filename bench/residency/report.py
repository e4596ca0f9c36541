"""The residency benchmark's figures and its section of ``bench/RESULTS.md``."""

from __future__ import annotations

import os
from typing import Any

from bench.residency.client import LOADED_AFTER, Record

HEADING = "## Residency: more models than memory"

LABELS = {
    "least-busy": "least busy node (a load balancer; the proxy with `--affinity off`)",
    "warm-first": "warm-first: a node with the model loaded (`/api/ps`), else least busy",
    "swapper": "per-node swapper (llama-swap-like: one model at a time per node)",
    "oracle": "static bin-packing by popularity (an oracle, not a router)",
    "nvpair": "nvpair-proxy (standalone, Ollama facade)",
}


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def summarize(records: list[Record], stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests, errors, the engines' loads and evictions, the share of requests that waited
    for a load, TTFT quantiles, requests per engine."""
    done = [r for r in records if not r.error and r.ttft is not None]
    ttfts = [r.ttft for r in done if r.ttft is not None]
    residency = [s["residency"] for s in stats]
    return {
        "requests": len(records),
        "errors": sum(1 for r in records if r.error),
        "loads": sum(int(r["loads"]) for r in residency),
        "evictions": sum(int(r["evictions"]) for r in residency),
        "waitedForLoad": sum(1 for r in done if r.loadSeconds > LOADED_AFTER) / max(1, len(done)),
        "ttft": {f"p{q}": percentile(ttfts, q / 100) for q in (50, 90, 99)},
        "perEngine": [int(s["completed"]) for s in stats],
        "loadedAtEnd": [r["loaded"] for r in residency],
    }


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f} s"


def markdown(results: dict[str, Any]) -> str:
    """The dated section: setup, then one row per router."""
    w, e = results["workload"], results["engines"]
    lines = [
        f"{HEADING}, run of {results['date']}",
        "",
        f"`{results['command']}` on {results['machine']}. {e['count']} simulated Ollama "
        f"engines holding {e['maxLoaded']} models each ({e['loadMs'] / 1000:g} s per load, one "
        f"at a time, least recently used idle model evicted; {e['slots']} slots per model), "
        f"starting empty; {w['models']} models, Zipf {w['zipf']:g} popularity, "
        f"{w['clients']} clients in closed loops (think {w['think']:g} s), "
        f"{w['duration']:g} s, seed {w['seed']}. "
        "Loads and evictions are the engines' own counts.",
        "",
        "| router | requests | errors | loads | evictions | waited for a load | TTFT p50 | "
        "p90 | p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in results["routers"].items():
        if "skipped" in s:
            lines.append(f"| {LABELS.get(name, name)} | skipped: {s['skipped']} |||||||| |")
            continue
        t = s["ttft"]
        lines.append(
            f"| {LABELS.get(name, name)} | {s['requests']} | {s['errors']} | {s['loads']} | "
            f"{s['evictions']} | {s['waitedForLoad'] * 100:.0f} % | {_s(t['p50'])} | "
            f"{_s(t['p90'])} | {_s(t['p99'])} |"
        )
    return "\n".join(lines) + "\n"


def writeSection(path: str, section: str) -> None:
    """Put ``section`` before the earlier runs of this benchmark (kept), or at the end."""
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    if HEADING in old:
        before, after = old.split(HEADING, 1)
        text = before + section + "\n" + HEADING + after
    else:
        text = old.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)
