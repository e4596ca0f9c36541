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


def pooled(runs: list[tuple[list[Record], list[dict[str, Any]]]]) -> dict[str, Any]:
    """One router's runs (each its requests and its engines' counters) as one summary: the
    TTFT quantiles and the shares over every request, the loads and evictions per run."""
    summary = summarize(
        [r for records, _ in runs for r in records], [s for _, stats in runs for s in stats]
    )
    if len(runs) > 1:  # which engine served what, and held what at the end, is per run
        del summary["perEngine"], summary["loadedAtEnd"]
    for key in ("loads", "evictions"):
        summary[f"{key}PerRun"] = [
            sum(int(s["residency"][key]) for s in stats) for _, stats in runs
        ]
    return summary


def _ratio(s: dict[str, Any], oracle: dict[str, Any] | None) -> str:
    """``s``'s TTFT p90 over the oracle's, or a dash without one."""
    mine, theirs = s["ttft"]["p90"], oracle["ttft"]["p90"] if oracle else None
    return "–" if mine is None or not theirs else f"{mine / theirs:.2f}×"


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f} s"


def markdown(results: dict[str, Any]) -> str:
    """The dated section: setup, then one row per router."""
    w, e = results["workload"], results["engines"]
    runs = results.get("runs", [])
    seeds = f"seed {w['seed']}"
    if len(runs) > 1:
        seeds = (
            f"{len(runs)} runs, seeds {runs[0]['seed']}–{runs[-1]['seed']}, every router in "
            "turn on each seed; the first table pools them (TTFT quantiles over every "
            "request of every run; loads and evictions per run), the second gives each run's "
            "TTFT p90"
        )
    lines = [
        f"{HEADING}, run of {results['date']}",
        "",
        f"`{results['command']}` on {results['machine']}. {e['count']} simulated Ollama "
        f"engines holding {e['maxLoaded']} models each ({e['loadMs'] / 1000:g} s per load, one "
        f"at a time, least recently used idle model evicted; {e['slots']} slots per model), "
        f"starting empty; {w['models']} models, Zipf {w['zipf']:g} popularity, "
        f"{w['clients']} clients in closed loops (think {w['think']:g} s), "
        f"{w['duration']:g} s, {seeds}. "
        "Loads and evictions are the engines' own counts.",
        "",
        "| router | requests | errors | loads | evictions | waited for a load | TTFT p50 | "
        "p90 | p99 | p90 / oracle's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    oracle = results["routers"].get("oracle")
    for name, s in results["routers"].items():
        t = s["ttft"]
        loads = ", ".join(str(n) for n in s.get("loadsPerRun", [s["loads"]]))
        evictions = ", ".join(str(n) for n in s.get("evictionsPerRun", [s["evictions"]]))
        lines.append(
            f"| {LABELS.get(name, name)} | {s['requests']} | {s['errors']} | {loads} | "
            f"{evictions} | {s['waitedForLoad'] * 100:.0f} % | {_s(t['p50'])} | "
            f"{_s(t['p90'])} | {_s(t['p99'])} | {_ratio(s, oracle)} |"
        )
    if len(runs) > 1:
        names = list(results["routers"])
        lines += ["", "| seed | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for run in runs:
            each = run["routers"]
            cells = [
                f"{_s(each[n]['ttft']['p90'])} ({_ratio(each[n], each.get('oracle'))})"
                for n in names
            ]
            lines.append(f"| {run['seed']} | " + " | ".join(cells) + " |")
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
