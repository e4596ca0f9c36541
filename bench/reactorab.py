"""A/B of the process reactor: ``ProxyReactor`` (``twistd --reactor=nvpair``, the plugin
``eventloop`` provides) against Twisted's stock epoll reactor (``twistd --reactor=epoll``).

The standalone proxy in front of the fake engine, one fresh proxy process per measurement;
each round measures both variants back to back, the order alternating from round to round.
The load is ``wrk`` (non-streaming POSTs) or ``bench.streams load`` (SSE, 50 chunks); the
proxy's CPU per request (or stream) is read from ``/proc/<pid>/stat``.  Loopback only,
every load bounded in time.

    .venv/bin/python -m bench.reactorab --rounds 8 --duration 5 --conns 32 --mode post
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from typing import Any

from bench import load, procs

VARIANTS = {"ProxyReactor": ["--reactor=nvpair"], "stock epoll": ["--reactor=epoll"]}


def startProxy(enginePort: int, reactorArgs: list[str]) -> procs.Server:
    """The standalone proxy (llama.cpp facade) with the given twistd reactor arguments."""
    state = tempfile.mkdtemp(prefix="nvpair-reactorab-")
    port = procs.freePort()
    with open(os.path.join(state, "llamacpp-proxy-port.json"), "w") as f:
        json.dump({"port": port}, f)
    twistd = os.path.join(procs.ROOT, ".venv", "bin", "twistd")
    argv = [
        procs.PYTHON,
        twistd,
        "-n",
        "--pidfile=",
        *reactorArgs,
        "nvpair-proxy",
        "--standalone",
        "--engines",
        "llamacpp",
        "--backend",
        f"llamacpp=http://127.0.0.1:{enginePort}",
        "--state-dir",
        state,
        "--ops-port",
        "0",
        "--max-connections",
        "2000",
    ]
    proc = procs.spawn(argv, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=state)
    procs.waitForPort(port, "proxy", proc)
    procs.waitForRoute(port)
    return procs.Server("nvpair", port, proc.pid, [proc])


def measure(server: procs.Server, args: argparse.Namespace, bodyFile: str) -> float:
    """One warm-up second, then the load; the proxy's CPU microseconds per request/stream."""
    pids = {"nvpair": server.pid}
    load.wrk(server.port, args.conns, 1, bodyFile, pids)
    if args.mode == "sse":
        result: dict[str, Any] = load.sse(server.port, args.conns, args.duration, 50, pids)
        return float(result["cpu_nvpair_us_per_stream"])
    result = load.wrk(server.port, args.conns, args.duration, bodyFile, pids)
    if result["errors"]:
        raise RuntimeError(f"wrk reported {result['errors']} errors")
    return float(result["cpu_nvpair_us_per_req"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reactorab")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--conns", type=int, default=32)
    parser.add_argument("--mode", choices=("post", "sse"), default="post")
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as body:
        body.write(load.CHAT_BODY)
    engine = procs.startEngine(50)
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        names = list(VARIANTS)
        for index in range(args.rounds):
            for name in names if index % 2 == 0 else names[::-1]:
                server = startProxy(engine.port, VARIANTS[name])
                try:
                    cpu[name].append(measure(server, args, body.name))
                finally:
                    server.close()
                print(f"round {index} {name}: {cpu[name][-1]:.1f} us", flush=True)
    finally:
        engine.close()
        os.unlink(body.name)
    a, b = cpu["ProxyReactor"], cpu["stock epoll"]
    paired = [y - x for x, y in zip(a, b, strict=True)]
    print(
        f"median CPU per {'stream' if args.mode == 'sse' else 'request'}: "
        f"ProxyReactor {statistics.median(a):.1f} us, stock {statistics.median(b):.1f} us "
        f"({100 * (statistics.median(b) - statistics.median(a)) / statistics.median(b):.1f} % "
        f"less); paired difference median {statistics.median(paired):.1f} us, "
        f"ProxyReactor lower in {sum(d > 0 for d in paired)} of {len(paired)} rounds"
    )


if __name__ == "__main__":
    main()
