"""The Rust routers as overhead peers beside nginx: the same fake engine, the same loads.

``sglang-router launch`` and ``vllm-router`` (``bench/.venv``, ``--policy cache_aware``, one
worker: the fake engine) are measured round by round against nginx with the load phase's
three metrics; the table gives medians and each peer's ratio to nginx in the same rounds.
A peer not installed in ``bench/.venv`` is skipped (``bench/run.sh`` installs both).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from typing import Any

from bench import load, procs
from bench.routing.routers import routerAvailable, startRustRouter

PEERS = ("sglang", "vllm")
_METRICS = (
    ("post32", "rps", "req/s at 32 connections", "{:.0f}"),
    ("post32", "cpu_server_us_per_req", "server CPU µs per request", "{:.1f}"),
    ("post1", "p50_us", "p50 µs at 1 connection", "{:.0f}"),
    ("sse16", "streams_per_s", "SSE streams/s at 16", "{:.0f}"),
    ("sse16", "ttfb_p50_us", "SSE TTFB p50 µs", "{:.0f}"),
)


def available() -> list[str]:
    """The peers installed here."""
    return [name for name in PEERS if routerAvailable(name) is None]


def peerPhase(
    args: argparse.Namespace, bodyFile: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Rounds of post32, post1 and sse16 on nginx and each installed peer."""
    names = available()
    if not names:
        return {"skipped": "sglang-router and vllm-router are not in bench/.venv"}
    engine = procs.startEngine(chunks=50)
    events = 50 + engine.extraEvents
    out = os.path.join(procs.ROOT, "bench", "out")
    servers = {"nginx": procs.startNginx(engine.port, out, args.fd_limit)}
    try:
        for name in names:
            servers[name] = startRustRouter(name, [f"http://127.0.0.1:{engine.port}"])
        configs = list(servers)
        for name in configs:  # warm-up
            load.wrk(servers[name].port, 32, args.warmup, bodyFile, {})
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            log(f"peers round {r + 1}/{args.rounds} (order {', '.join(order)})")
            current: dict[str, Any] = {name: {} for name in configs}
            for name in order:
                pids = {"server": servers[name].pid, "engine": engine.pid}
                port = servers[name].port
                current[name]["post32"] = load.wrk(port, 32, args.duration, bodyFile, pids)
                current[name]["post1"] = load.wrk(port, 1, args.duration, bodyFile, pids)
                current[name]["sse16"] = load.sse(port, 16, args.duration, events, pids)
            rounds.append(current)
        return {"configs": configs, "rounds": rounds, "engine": engine.engineKind}
    finally:
        for server in [*servers.values(), engine]:
            server.close()


def markdown(peers: dict[str, Any]) -> str:
    """The section of the run's results: medians and same-round ratios to nginx."""
    if "skipped" in peers:
        return f"\n### Overhead peers\n\nSkipped: {peers['skipped']}.\n"
    configs, rounds = peers["configs"], peers["rounds"]
    others = [c for c in configs if c != "nginx"]
    head = "| metric | " + " | ".join(configs) + " | " + " | ".join(f"{c}/nginx" for c in others)
    lines = [
        "",
        "### Overhead peers",
        "",
        "The Rust routers in front of the same fake engine "
        f"({peers['engine']}), one worker, `--policy cache_aware`, measured in the same rounds as "
        "nginx (medians over rounds; ratios per round, then the median).",
        "",
        head + " |",
        "|---|" + "---:|" * (len(configs) + len(others)),
    ]
    for metric, key, label, fmt in _METRICS:
        med = {c: statistics.median(r[c][metric][key] for r in rounds) for c in configs}
        ratios = [
            statistics.median(r[c][metric][key] / r["nginx"][metric][key] for r in rounds)
            if all(r["nginx"][metric][key] for r in rounds)
            else float("nan")
            for c in others
        ]
        cells = [fmt.format(med[c]) for c in configs] + [f"{x:.2f}" for x in ratios]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    errors = [
        str(
            sum(int(r[c][m].get("errors", 0)) for r in rounds for m in ("post32", "post1", "sse16"))
        )
        for c in configs
    ]
    lines.append("| errors (all runs) | " + " | ".join(errors) + " |" + " |" * len(others))
    return "\n".join(lines) + "\n"
