"""The benchmark: direct vs nginx vs nvpair on 127.0.0.1, alternating round by round.

    bench/run.sh [--quick] [--rounds N] [--proxy-mode broker|standalone] [--no-held]
                 [--no-profile] [--no-routing] [--no-peers]

Phases: (1) load: one fake engine (50-chunk answers), nginx and the proxy in front of it;
each round runs every metric on every configuration (the order rotates from round to round);
(2) a py-spy profile of the proxy under the 32-connection load and under the SSE load;
(3) held streams: fresh servers per configuration and size, a slow engine keeping every
stream open, the server's RSS sampled; (4) the Rust routers (sglang-router, vllm-router) as
overhead peers beside nginx (``bench.peers``); (5) the routing micro-benchmark.  Writes
``bench/out/results.json``, ``bench/RESULTS.md`` and ``bench/ratios.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import load, peers, procs, profile, report

OUT = os.path.join(procs.ROOT, "bench", "out")
CONFIGS = ("direct", "nginx", "nvpair")


def log(message: str) -> None:
    """Progress on stderr."""
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    sys.stderr.write(f"[bench {stamp}] {message}\n")
    sys.stderr.flush()


def raiseFdLimit() -> int:
    """Raise the soft fd limit to the hard one (inherited by every child); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _firstLine(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).splitlines()
    return lines[0] if lines else ""


def machine() -> dict[str, Any]:
    """nproc, CPU model, memory, kernel."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem / 1024 / 1024, 1),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "nginx": subprocess.run(
            [procs.nginxBinary() or "nginx", "-v"], capture_output=True, text=True
        ).stderr.strip(),
        "wrk": " ".join(_firstLine(["wrk", "-v"]).split()[:2]),
        "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def startProxy(mode: str, enginePort: int, maxConnections: int) -> procs.Server:
    """The proxy in the chosen mode in front of the engine."""
    if mode == "standalone":
        return procs.startProxyStandalone(enginePort, maxConnections)
    return procs.startProxyBroker(enginePort, maxConnections)


def loadPhase(
    args: argparse.Namespace, bodyFile: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rounds of every metric on every configuration; then the profiles."""
    engine = procs.startEngine(chunks=50)
    events50 = 50 + engine.extraEvents
    nginx = procs.startNginx(engine.port, OUT, args.fd_limit)
    proxy = startProxy(args.proxy_mode, engine.port, 20000)
    servers = {"direct": engine, "nginx": nginx, "nvpair": proxy}
    log(
        f"engine ({engine.engineKind}) :{engine.port} pid {engine.pid}; "
        f"nginx :{nginx.port} pid {nginx.pid}; "
        f"nvpair :{proxy.port} pid {proxy.pid} ({args.proxy_mode})"
    )

    def accounted(name: str) -> dict[str, int]:
        pids = {"server": servers[name].pid, "engine": engine.pid}
        pids.update(servers[name].extraPids)
        if name == "direct":
            del pids["engine"]
        return pids

    extras: dict[str, Any] = {}
    try:
        for name in CONFIGS:  # warm-up: connections, pools, caches
            load.wrk(servers[name].port, 32, args.warmup, bodyFile, {})
            load.sse(servers[name].port, 16, args.warmup / 2, events50, {})
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = CONFIGS[r % 3 :] + CONFIGS[: r % 3]
            current: dict[str, Any] = {name: {} for name in CONFIGS}
            log(f"round {r + 1}/{args.rounds} (order {', '.join(order)})")
            for name in order:
                current[name]["post32"] = load.wrk(
                    servers[name].port, 32, args.duration, bodyFile, accounted(name)
                )
            for name in order:
                current[name]["post1"] = load.wrk(
                    servers[name].port, 1, args.duration, bodyFile, accounted(name)
                )
            for name in order:
                current[name]["sse16"] = load.sse(
                    servers[name].port, 16, args.duration, events50, accounted(name)
                )
            for name in CONFIGS:
                c = current[name]
                log(
                    f"  {name:7s} post32 {c['post32']['rps']:8.0f} req/s  "
                    f"post1 p50 {c['post1']['p50_us']:6d} us  "
                    f"sse16 {c['sse16']['streams_per_s']:7.0f}/s ttfb p50 "
                    f"{c['sse16']['ttfb_p50_us']:7.0f} us  "
                    f"cpu {c['post32']['cpu_server_us_per_req']:6.1f} us/req"
                )
            rounds.append(current)
        extras["upstream"] = upstreamSockets(engine.port)
        extras["engine"] = engine.engineKind
        if not args.no_profile and profile.available():
            extras["profiles"] = profiles(args, proxy, bodyFile, events50)
        elif not args.no_profile:
            log("py-spy is not installed in bench/.venv: no profile")
        extras["proxy_rss_after_load_kib"] = procs.rssKiB(proxy.pid)
    finally:
        for server in (proxy, nginx, engine):
            server.close()
    return rounds, extras


def upstreamSockets(enginePort: int) -> dict[str, int]:
    """TCP sockets to the engine port by state (TIME-WAIT counts connection churn)."""
    done = subprocess.run(
        ["ss", "-tanH", "dport", "=", f":{enginePort}"], capture_output=True, text=True
    )
    states: dict[str, int] = {}
    for line in done.stdout.splitlines():
        if line.strip():
            state = line.split()[0]
            states[state] = states.get(state, 0) + 1
    return states


def profiles(
    args: argparse.Namespace, proxy: procs.Server, bodyFile: str, events50: int
) -> dict[str, Any]:
    """py-spy profiles of the proxy under the POST and the SSE loads."""
    seconds = args.profile_seconds
    out: dict[str, Any] = {}
    loads: dict[str, Callable[[], Any]] = {
        "post32": lambda: load.wrk(proxy.port, 32, seconds + 1, bodyFile, {}),
        "sse16": lambda: load.sse(proxy.port, 16, seconds + 1, events50, {}),
    }
    for name, run in loads.items():
        raw = os.path.join(OUT, f"profile-{name}.txt")
        log(f"profiling the proxy (pid {proxy.pid}) under {name} for {seconds:g}s")
        profile.record(proxy.pid, seconds, raw, "raw", run)
        if not args.quick:
            svg = os.path.join(OUT, f"profile-{name}.svg")
            profile.record(proxy.pid, seconds, svg, "flamegraph", run)
        if os.path.exists(raw):
            out[name] = profile.summarize(raw)
    return out


def heldPhase(args: argparse.Namespace) -> dict[str, Any]:
    """Held streams: fresh servers per configuration and size, RSS sampled."""
    results: dict[str, Any] = {}
    # The proxy and nginx hold two descriptors per stream; stay under the hard limit with
    # room for listeners, pipes and nginx's cached upstream connections.
    biggest = min(10000, (args.fd_limit - 600) // 2)
    sizes = [1000] if args.quick else [1000, biggest]
    for size in sizes:
        chunks, delay = (10, 0.5) if size <= 1000 else (12, 4.0)
        for name in CONFIGS:
            log(f"held streams: {size} on {name} ({chunks} chunks every {delay:g}s)")
            engine = procs.startEngine(chunks=chunks, chunkDelay=delay)
            server: procs.Server | None = None
            try:
                if name == "nginx":
                    server = procs.startNginx(engine.port, OUT, args.fd_limit)
                elif name == "nvpair":
                    server = startProxy(args.proxy_mode, engine.port, 20000)
                target = server or engine
                for _ in range(20):
                    procs.post(target.port)
                result = load.hold(
                    target.port,
                    size,
                    chunks + engine.extraEvents,
                    target.pid,
                    timeout=60 + chunks * delay + size / 100,
                )
                result["fds_note"] = f"fd limit {args.fd_limit}"
                results[f"{name}:{size}"] = result
                log(
                    f"  all complete: {result.get('all_complete')} ({result.get('complete')}"
                    f"/{size}, peak open {result.get('peak')}), peak RSS "
                    f"{result['peak_rss_kib']} KiB, {result['rss_per_stream_kib']:.1f} KiB/stream"
                )
            except Exception as e:  # keep going: report the failure
                log(f"  failed: {e}")
                results[f"{name}:{size}"] = {"all_complete": False, "error": str(e)}
            finally:
                if server is not None:
                    server.close()
                engine.close()
    results["sizes"] = sizes
    return results


def routingPhase(args: argparse.Namespace) -> dict[str, Any]:
    """The in-process routing micro-benchmark (its own process)."""
    argv = [
        procs.PYTHON,
        "-m",
        "bench.routingcost",
        "--rounds",
        str(max(3, args.rounds)),
        "--requests",
        "5000" if args.quick else "20000",
    ]
    log("routing micro-benchmark (building a 1,000 x 10,000 snapshot takes a few seconds)")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=procs.ROOT, timeout=600)
    sys.stderr.write(done.stderr)
    return load._benchJSON(done.stdout)


def parseArgs(argv: list[str]) -> argparse.Namespace:
    """Command-line options; ``--quick`` shortens everything and skips the 10k streams."""
    parser = argparse.ArgumentParser(prog="bench/run.sh")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--duration", type=float, help="seconds per load run")
    parser.add_argument("--proxy-mode", choices=("broker", "standalone"), default="broker")
    parser.add_argument("--no-held", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--no-routing", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="skip the Rust routers")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.duration = args.duration or (2.0 if args.quick else 6.0)
    args.warmup = 1.0 if args.quick else 3.0
    args.profile_seconds = 4 if args.quick else 10
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every phase and write the results."""
    raw = sys.argv[1:] if argv is None else argv
    args = parseArgs(raw)
    os.makedirs(OUT, exist_ok=True)
    args.fd_limit = raiseFdLimit()
    for tool in ("wrk",):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            sys.exit(f"{tool} is not installed (bench/run.sh installs it)")
    if procs.nginxBinary() is None:
        sys.exit("nginx is not installed (bench/run.sh installs it)")
    bodyFile = os.path.join(OUT, "body.json")
    with open(bodyFile, "w") as f:
        f.write(load.CHAT_BODY)
    started = time.monotonic()
    results: dict[str, Any] = {
        "command": os.environ.get("BENCH_COMMAND", "").strip()
        or "python -m bench.run " + shlex.join(raw),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items()},
    }
    results["rounds"], results["extras"] = loadPhase(args, bodyFile)
    if not args.no_held:
        results["held"] = heldPhase(args)
    if not args.no_peers:
        results["peers"] = peers.peerPhase(args, bodyFile, log)
    if not args.no_routing:
        results["routing"] = routingPhase(args)
    results["elapsed_s"] = time.monotonic() - started
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    bench = os.path.join(procs.ROOT, "bench")
    # A quick run never replaces the full results: it writes under bench/out/.
    markdownPath = (
        os.path.join(OUT, "RESULTS-quick.md") if args.quick else os.path.join(bench, "RESULTS.md")
    )
    plotPath = (
        os.path.join(OUT, "ratios-quick.png") if args.quick else os.path.join(bench, "ratios.png")
    )
    summary = report.write(results, markdownPath, os.path.join(OUT, "summary.json"))
    plotPy = os.path.join(bench, ".venv", "bin", "python")
    if os.access(plotPy, os.X_OK):
        subprocess.run(
            [plotPy, "-m", "bench.plot", os.path.join(OUT, "summary.json"), plotPath],
            cwd=procs.ROOT,
            check=False,
            timeout=120,
        )
    else:
        log("bench/.venv is missing: no plot (bench/run.sh creates it)")
    sys.stdout.write(summary)
    log(f"done in {results['elapsed_s']:.0f}s: {markdownPath}, {plotPath}")


if __name__ == "__main__":
    main()
