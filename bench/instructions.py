"""Instructions per request: the standalone proxy's CPU cost counted, not timed.

On a shared 2-core machine the proxy's CPU per request under ``wrk`` spreads ±20 % from
round to round (other tenants, frequency, the engine and the load generator on the same
cores), too much to see a 5 % change.  This counts instead: the proxy runs under
valgrind's ``callgrind`` (every instruction the process executes), in front of the
shared Node engine, and one keep-alive client sends non-streamed chat completions one
after the other.  Two runs, ``--few`` and ``--many`` requests; the difference of their
instruction totals over the difference of the counts is the cost of one request, start-up
and shutdown cancelled out.  What stays is what runs on the clock (probes, sweeps) during
the longer run's extra seconds: about ±1–2 % run to run.

Each source tree given is measured with the same venv (``PYTHONPATH`` points the proxy at
it), so a worktree of an older commit is compared with main in the same run::

    .venv/bin/python -m bench.instructions /path/to/worktree-of-before /work/main

``--proxy-mode broker`` measures the proxy as ``bench/run.sh`` runs it by default: under
the scripted broker (``bench.brokerhost``, which is given a ``twistd`` wrapper that starts
the proxy under valgrind); the standalone scheduler's features are off there.

Loopback only; every loop bounded.  Needs ``valgrind`` (Debian's package) and Node.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from bench import load, procs


def total(path: str) -> int:
    """The instruction count callgrind wrote in its ``summary:`` (or ``totals:``) line."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no total in {path}")


def _send(port: int, requests: int) -> None:
    """``requests`` chat completions one after the other on one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    for _ in range(requests):
        conn.request("POST", "/v1/chat/completions", load.CHAT_BODY.encode(), headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"answer {answer.status} through the proxy")
    conn.close()


def count(tree: str, requests: int, enginePort: int) -> int:
    """Instructions the standalone proxy (sources from ``tree``) executed serving
    ``requests`` chat completions once its route is known, start to exit."""
    state, port = procs.standaloneState()
    out = os.path.join(state, "callgrind.out")
    backend = f"http://127.0.0.1:{enginePort}"
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        *procs.standaloneArgv([backend], state),
    ]
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.Popen(
        argv, cwd=state, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        procs.waitForPort(port, "proxy under valgrind", proc, timeout=300)
        procs.waitForRoute(port, timeout=120)  # discovery's first probe has answered
        _send(port, requests)
    finally:
        proc.send_signal(signal.SIGTERM)  # SIGINT is ignored in a background job
        proc.wait(300)
    return total(out)


def countBroker(tree: str, requests: int, enginePort: int) -> int:
    """As ``count``, the proxy under the scripted broker (one facade, one node)."""
    state = tempfile.mkdtemp(prefix="nvpair-bench-state-")
    out = os.path.join(state, "callgrind.out")
    wrapper = os.path.join(state, "twistd")
    with open(wrapper, "w") as f:
        twistd = procs.twistdCommand()[-1]
        f.write(
            f'#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={out} {twistd} "$@"\n'
        )
    os.chmod(wrapper, 0o755)
    port = procs.freePort()
    argv = [procs.PYTHON, "-m", "bench.brokerhost", "--engine-port", str(enginePort)]
    argv += ["--facade-port", str(port), "--state-dir", state, "--twistd", wrapper]
    argv += ["--request-timeout", "600"]
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        procs.readJSONLine(proc, "scripted broker", 600)
        procs.waitForRoute(port, timeout=120)
        _send(port, requests)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the broker stops the proxy, which writes its counts
        proc.wait(300)
    return total(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="source trees (the repository's root)")
    parser.add_argument("--few", type=int, default=100)
    parser.add_argument("--many", type=int, default=900)
    parser.add_argument("--proxy-mode", choices=("standalone", "broker"), default="standalone")
    args = parser.parse_args()
    measure = countBroker if args.proxy_mode == "broker" else count
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    engine = procs.startEngine(1)
    try:
        for tree in args.trees:
            few = measure(os.path.abspath(tree), args.few, engine.port)
            many = measure(os.path.abspath(tree), args.many, engine.port)
            perRequest = (many - few) / (args.many - args.few)
            line = {
                "tree": tree,
                "mode": args.proxy_mode,
                "instructionsPerRequest": round(perRequest),
            }
            print(json.dumps(line))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
