"""Turn a run's raw results into medians, same-round ratios, targets and ``RESULTS.md``.

Every ratio is computed within a round (the configurations ran back to back) and the
median over rounds is reported.  A full run's markdown replaces the "latest run" section
of ``RESULTS.md`` and the previous latest run moves below it (two earlier runs are kept).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from typing import Any

from bench import profile
from bench.peers import markdown as peersMarkdown

CONFIGS = ("direct", "nginx", "nvpair")
MARK = "<!-- bench:run -->"
# Everything after this marker (the long chaos soak's figures) is kept across runs.
SOAK_MARK = "<!-- bench:soak -->"
KEEP = 2


def _median(values: list[float]) -> float:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(clean) if clean else float("nan")


def _get(rounds: list[dict[str, Any]], name: str, metric: str, key: str) -> list[float]:
    return [float(r[name][metric].get(key, float("nan"))) for r in rounds]


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Medians per configuration, same-round ratios and differences, and the targets."""
    rounds = results["rounds"]
    rows: list[tuple[str, str, str, str, bool]] = [
        # label, metric, key, unit, higher is better
        ("POST throughput, 32 conns", "post32", "rps", "req/s", True),
        ("POST latency p50, 32 conns", "post32", "p50_us", "µs", False),
        ("POST latency p99, 32 conns", "post32", "p99_us", "µs", False),
        ("POST latency p50, 1 conn", "post1", "p50_us", "µs", False),
        ("POST latency p99, 1 conn", "post1", "p99_us", "µs", False),
        ("server CPU per request (32 conns)", "post32", "cpu_server_us_per_req", "µs", False),
        ("SSE streams/s, 16 conns", "sse16", "streams_per_s", "streams/s", True),
        ("server CPU per stream (SSE, 16 conns)", "sse16", "cpu_server_us_per_stream", "µs", False),
        ("SSE TTFB p50, 16 conns", "sse16", "ttfb_p50_us", "µs", False),
        ("SSE TTFB p99, 16 conns", "sse16", "ttfb_p99_us", "µs", False),
        ("SSE stream total p50, 16 conns", "sse16", "total_p50_us", "µs", False),
        ("SSE stream total p99, 16 conns", "sse16", "total_p99_us", "µs", False),
    ]
    table = []
    for label, metric, key, unit, higher in rows:
        values = {n: _get(rounds, n, metric, key) for n in CONFIGS}
        entry: dict[str, Any] = {
            "label": label,
            "unit": unit,
            "higher_is_better": higher,
            "metric": metric,
            "key": key,
        }
        for n in CONFIGS:
            entry[n] = _median(values[n])
        for a, b in (("nvpair", "direct"), ("nvpair", "nginx"), ("nginx", "direct")):
            entry[f"{a}/{b}"] = _median(
                [x / y if y else float("nan") for x, y in zip(values[a], values[b], strict=True)]
            )
        table.append(entry)

    def diff(metric: str, key: str, a: str, b: str = "direct") -> float:
        return _median(
            [
                x - y
                for x, y in zip(
                    _get(rounds, a, metric, key), _get(rounds, b, metric, key), strict=True
                )
            ]
        )

    added = {
        n: {"p50": diff("post1", "p50_us", n), "p99": diff("post1", "p99_us", n)}
        for n in ("nginx", "nvpair")
    }
    ttfbOver = {n: diff("sse16", "ttfb_p50_us", n) for n in ("nginx", "nvpair")}
    errors = {
        n: sum(
            r[n]["post32"]["errors"]
            + r[n]["post1"]["errors"]
            + r[n]["sse16"]["errors"]
            + r[n]["sse16"]["incomplete"]
            for r in rounds
        )
        for n in CONFIGS
    }
    extraCpu = {
        k: _median(_get(rounds, "nvpair", "post32", f"cpu_{k}_us_per_req"))
        for k in ("broker", "engine")
        if f"cpu_{k}_us_per_req" in rounds[0]["nvpair"]["post32"]
    }
    utilization = {
        metric: {
            "machine_busy_pct": _median(_get(rounds, "nvpair", metric, "machine_busy_pct")),
            "server_pct": {n: _median(_get(rounds, n, metric, "cpu_server_pct")) for n in CONFIGS},
        }
        for metric in ("post32", "post1", "sse16")
    }
    byKey = {(e["metric"], e["key"]): e for e in table}
    targets = []

    def target(name: str, value: float, limit: float, ok: bool, fmt: str) -> None:
        targets.append(
            {
                "name": name,
                "value": value,
                "limit": limit,
                "fmt": fmt,
                "pass": bool(ok) and not math.isnan(value),
            }
        )

    # The targets of issue 15 (strict HTTP on llhttp), all from the same run.
    target(
        "added p50 latency at 1 connection ≤ 150 µs",
        added["nvpair"]["p50"],
        150,
        added["nvpair"]["p50"] <= 150,
        "{:.0f} µs",
    )
    cpu = byKey[("post32", "cpu_server_us_per_req")]["nvpair"]
    target("CPU per request at 32 connections ≤ 100 µs", cpu, 100, cpu <= 100, "{:.0f} µs")
    share = byKey[("post32", "rps")]["nvpair/nginx"]
    target(
        "throughput at 32 connections ≥ 25% of nginx", share * 100, 25, share >= 0.25, "{:.1f} %"
    )
    sseCpu = byKey[("sse16", "cpu_server_us_per_stream")]["nvpair/nginx"]
    target("SSE proxy CPU per stream ≤ 1.5× nginx's", sseCpu, 1.5, sseCpu <= 1.5, "{:.2f}×")
    target(
        "SSE TTFB p50 overhead ≤ 1.5 ms over direct",
        ttfbOver["nvpair"],
        1500,
        ttfbOver["nvpair"] <= 1500,
        "{:.0f} µs",
    )
    held = results.get("held")
    if held:
        big = max(held["sizes"])
        h = held.get(f"nvpair:{big}", {})
        per = float(h.get("rss_per_stream_kib", float("nan")))
        target(
            f"{big:,} concurrent streams complete with ≤ 16 KiB RSS per stream",
            per,
            16,
            bool(h.get("all_complete")) and per <= 16,
            "{:.1f} KiB/stream",
        )
    routing = results.get("routing")
    if routing:
        med = routing["median_us"]
        worst = max(
            med[f"{s}:1000"] / med[f"{s}:1"]
            for s in ("standalone", "scheduled")
            if f"{s}:1000" in med and f"{s}:1" in med
        )
        target("routing cost within 2× from 1 to 1,000 nodes", worst, 2, worst <= 2, "{:.2f}×")
    headroom = byKey[("post32", "rps")]["nvpair/direct"]
    return {
        "table": table,
        "added": added,
        "ttfb_overhead": ttfbOver,
        "errors": errors,
        "targets": targets,
        "nvpair_extra_cpu": extraCpu,
        "utilization": utilization,
        "engine_headroom": 1 / headroom if headroom else float("nan"),
    }


def _fmt(value: float, unit: str) -> str:
    if value is None or math.isnan(value):
        return "–"
    if unit in ("req/s", "streams/s"):
        return f"{value:,.0f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def markdown(results: dict[str, Any], s: dict[str, Any]) -> str:
    """The markdown of one run."""
    m = results["machine"]
    settings = results["settings"]
    out = [
        f"## Run of {results['date']}{' (quick)' if settings['quick'] else ''}",
        "",
        f"* command: `{results['command']}` (proxy under a {settings['proxy_mode']} setup; "
        f"{settings['rounds']} rounds of {settings['duration']:g} s per load, configurations "
        f"alternating; medians of rounds; ratios and differences are same-round, then median)",
        f"* machine: {m['nproc']} CPUs, {m['cpu']}, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, {m['nginx']}, {m['wrk']}, fd limit {m['fd_limit']}; load "
        f"average at start {m.get('loadavg_at_start', '?')} (other work shares this machine)",
        f"* elapsed: {results['elapsed_s']:.0f} s",
        "",
        "### Targets",
        "",
        "| target | measured | result |",
        "|---|---:|---|",
    ]
    for t in s["targets"]:
        out.append(
            f"| {t['name']} | {t['fmt'].format(t['value'])} | {'PASS' if t['pass'] else 'FAIL'} |"
        )
    out += [
        "",
        "### Side by side",
        "",
        "| metric | direct | nginx | nvpair | nvpair/direct | nvpair/nginx | nginx/direct |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in s["table"]:
        unit = e["unit"]
        out.append(
            f"| {e['label']} ({unit}) | {_fmt(e['direct'], unit)} | {_fmt(e['nginx'], unit)} | "
            f"{_fmt(e['nvpair'], unit)} | {e['nvpair/direct']:.2f} | {e['nvpair/nginx']:.2f} | "
            f"{e['nginx/direct']:.2f} |"
        )
    a = s["added"]
    out += [
        "",
        f"* added latency at 1 connection over direct: nginx p50 {a['nginx']['p50']:.0f} µs / "
        f"p99 {a['nginx']['p99']:.0f} µs; nvpair p50 {a['nvpair']['p50']:.0f} µs / "
        f"p99 {a['nvpair']['p99']:.0f} µs",
        f"* SSE TTFB p50 over direct: nginx {s['ttfb_overhead']['nginx']:.0f} µs, "
        f"nvpair {s['ttfb_overhead']['nvpair']:.0f} µs",
        "* server CPU per request: direct = the fake engine, nginx = its single process, "
        "nvpair = the proxy process only"
        + "".join(
            f"; the {k} spent {v:.0f} µs/request more" for k, v in s["nvpair_extra_cpu"].items()
        ),
        f"* fake engine: {results.get('extras', {}).get('engine') or '?'} "
        "(node = the shared Node engine; python = nvpair.proxy.testing.fakeengine, "
        "which limits nginx)",
        f"* fake engine headroom: direct throughput is {s['engine_headroom']:.1f}× the proxy's",
        "* errors + incomplete streams over all rounds: "
        + ", ".join(f"{n} {s['errors'][n]}" for n in CONFIGS),
    ]
    for metric, u in s["utilization"].items():
        shares = ", ".join(f"{n} {u['server_pct'][n]:.0f}%" for n in CONFIGS)
        out.append(
            f"* {metric}: server process busy (share of one CPU): {shares}; whole "
            f"machine busy during the nvpair run {u['machine_busy_pct']:.0f}% of "
            f"{m['nproc']} CPUs"
        )
    up = results.get("extras", {}).get("upstream")
    if up:
        out.append(f"* sockets to the engine port after the load phase: {up}")
    held = results.get("held")
    if held:
        out += [
            "",
            "### Held streams",
            "",
            "| configuration | streams | all complete | peak open | baseline RSS KiB | "
            "peak RSS KiB | KiB per stream |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        for size in held["sizes"]:
            for n in CONFIGS:
                h = held.get(f"{n}:{size}", {})
                out.append(
                    f"| {n} | {size:,} | {'yes' if h.get('all_complete') else 'NO'} "
                    f"({h.get('complete', 0)}) | {h.get('peak', '–')} | "
                    f"{h.get('baseline_rss_kib', '–')} | {h.get('peak_rss_kib', '–')} | "
                    f"{h.get('rss_per_stream_kib', float('nan')):.1f} |"
                )
        out.append("")
        out.append(
            "The server measured is the fake engine for direct, nginx, and the proxy "
            "process for nvpair; KiB per stream = (peak RSS − RSS before) / streams. "
            "A proxied stream holds two descriptors; the hard fd limit here "
            f"({m['fd_limit']}, not raisable without CAP_SYS_RESOURCE) caps the largest "
            f"size at {max(held['sizes']):,}."
        )
    routing = results.get("routing")
    if routing:
        med = routing["median_us"]
        out += [
            "",
            "### Routing cost per request (in-process)",
            "",
            f"admission + owners + orderCandidates + placeReservation + reserve/release, "
            f"{routing['models']:,} models on every node, {routing['requests']:,} requests "
            f"per round, {routing['rounds']} rounds, 32 reservations in flight; admission "
            f"alone {med['admission']:.2f} µs.",
            "",
            "| nodes | snapshot build s | no scheduler µs | ×1 node | with scheduler µs | "
            "×1 node |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for n in routing["build_s"]:
            out.append(
                f"| {int(n):,} | {routing['build_s'][n]:.2f} | {med[f'standalone:{n}']:.2f} | "
                f"{med[f'standalone:{n}'] / med['standalone:1']:.2f} | "
                f"{med[f'scheduled:{n}']:.2f} | {med[f'scheduled:{n}'] / med['scheduled:1']:.2f} |"
            )
    profiles = results.get("extras", {}).get("profiles")
    if profiles:
        out += ["", "### Where the proxy's CPU goes (py-spy)", ""]
        for name, summary in profiles.items():
            out += [f"#### under {name}", "", profile.formatSummary(summary, 15)]
    out += [
        "",
        "### Per round",
        "",
        "| round | config | post32 req/s | post1 p50 µs | "
        "sse16 streams/s | TTFB p50 µs | CPU µs/req |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(results["rounds"], 1):
        for n in CONFIGS:
            c = r[n]
            out.append(
                f"| {i} | {n} | {c['post32']['rps']:,.0f} | {c['post1']['p50_us']} | "
                f"{c['sse16']['streams_per_s']:,.0f} | {c['sse16']['ttfb_p50_us']:.0f} | "
                f"{c['post32']['cpu_server_us_per_req']:.1f} |"
            )
    return "\n".join(out) + "\n"


HEADER = """# Benchmark results

Generated by `bench/run.sh` (see `bench/README.md`): the proxy (`nvpair`) against the fake
engine reached directly (`direct`) and through nginx (`nginx`), all on 127.0.0.1 of this
machine. The newest full run comes first; earlier runs follow. `bench/ratios.png` plots the
newest run's ratios.

"""


def write(
    results: dict[str, Any],
    path: str,
    summaryPath: str | None = None,
    log: Callable[[str], None] | None = None,
) -> str:
    """Write the run's markdown (and ``summary.json`` for the plot); return the markdown."""
    s = summarize(results)
    text = markdown(results, s)
    if "peers" in results:  # bench/peers.py: the Rust routers beside nginx
        text += peersMarkdown(results["peers"])
    summaryPath = summaryPath or os.path.join(os.path.dirname(path), "out", "summary.json")
    with open(summaryPath, "w") as f:
        json.dump(
            {"table": s["table"], "targets": s["targets"], "date": results["date"]}, f, indent=1
        )
    if results["settings"]["quick"]:
        with open(path, "w") as f:
            f.write(HEADER + MARK + "\n" + text)
        return text
    earlier: list[str] = []
    soak = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if SOAK_MARK in old:
            old, rest = old.split(SOAK_MARK, 1)
            soak = SOAK_MARK + rest
        earlier = [part for part in old.split(MARK)[1:] if "(quick)" not in part.split("\n")[1]]
    runs = [text, *[e.strip("\n") + "\n" for e in earlier[:KEEP]]]
    with open(path, "w") as f:
        f.write(HEADER + "".join(MARK + "\n" + r + "\n" for r in runs) + soak)
    return text
