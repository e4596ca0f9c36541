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

from bench import load, procs


def total(path: str) -> int:
    """The instruction count callgrind wrote in its ``summary:`` (or ``totals:``) line."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no total in {path}")


def count(tree: str, requests: int, enginePort: int) -> int:
    """Instructions the proxy (sources from ``tree``) executed serving ``requests``
    chat completions once its route is known, start to exit."""
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
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"Content-Type": "application/json"}
        for _ in range(requests):
            conn.request("POST", "/v1/chat/completions", load.CHAT_BODY.encode(), headers)
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"answer {answer.status} through the proxy")
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)  # SIGINT is ignored in a background job
        proc.wait(300)
    return total(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="source trees (the repository's root)")
    parser.add_argument("--few", type=int, default=100)
    parser.add_argument("--many", type=int, default=900)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    engine = procs.startEngine(1)
    try:
        for tree in args.trees:
            few = count(os.path.abspath(tree), args.few, engine.port)
            many = count(os.path.abspath(tree), args.many, engine.port)
            perRequest = (many - few) / (args.many - args.few)
            print(json.dumps({"tree": tree, "instructionsPerRequest": round(perRequest)}))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
