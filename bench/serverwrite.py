"""Loopback A/B of ``fastwrite``: server CPU per request with direct sends on and off.

    .venv/bin/python -m bench.serverwrite [--connections 8] [--requests 4000] [--rounds 3]

A child process serves ``bench.serverparse``'s answering door on 127.0.0.1 with the default
reactor, ``fastwrite.DIRECT`` on ("direct": a response written to an idle transport goes
straight to ``send``) or off ("public": every response takes ``transport.write``, queued for
the reactor's next turn).  This process drives it from blocking sockets on threads
(keep-alive, one request in flight per connection, ``--requests`` per connection); the
child reports its own CPU time (user + system) per request over all but the first tenth of
the requests.  Rounds alternate the two sides; prints each figure, the best of each side,
and ``BENCHJSON``.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import threading
from typing import Any

from bench.serverparse import ANSWER, REQUEST, AnsweringDoor


def serve(mode: str, total: int) -> None:
    """The child: serve until ``total`` requests are answered, then report and exit."""
    from twisted.internet import reactor as installed

    reactor: Any = installed  # the installed reactor: TCP, time and run

    from nvpair.proxy.http import fastwrite
    from nvpair.proxy.http.site import FacadeSite

    fastwrite.DIRECT = mode == "direct"
    warmup = total // 10
    state: dict[str, Any] = {"n": 0}

    class CountingDoor(AnsweringDoor):
        """Answers like ``AnsweringDoor`` and starts and stops the CPU measurement."""

        def handle(self, request: Any) -> None:
            super().handle(request)
            state["n"] += 1
            if state["n"] == warmup:
                state["start"] = resource.getrusage(resource.RUSAGE_SELF)
            elif state["n"] == total:
                end = resource.getrusage(resource.RUSAGE_SELF)
                start = state["start"]
                cpu = (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)
                print(
                    json.dumps({"mode": mode, "us_per_request": cpu / (total - warmup) * 1e6}),
                    flush=True,
                )
                reactor.callLater(0, reactor.stop)

    site = FacadeSite(CountingDoor(), reactor, 1 << 20, 30.0, 65536)
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    print(port.getHost().port, flush=True)
    reactor.run()


def drive(port: int, count: int) -> None:
    """One keep-alive client: ``count`` requests, each answer read whole before the next."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(count):
            s.sendall(REQUEST)
            got = b""
            while not got.endswith(ANSWER):
                data = s.recv(65536)
                if not data:
                    return
                got += data


def measure(mode: str, connections: int, requests: int) -> float:
    """One side, one round: the child's CPU µs per request."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.serverwrite",
            "--serve",
            mode,
            "--total",
            str(connections * requests),
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    port = int(child.stdout.readline())
    threads = [threading.Thread(target=drive, args=(port, requests)) for _ in range(connections)]
    for t in threads:
        t.start()
    result = json.loads(child.stdout.readline())
    for t in threads:
        t.join()
    child.wait(timeout=30)
    return float(result["us_per_request"])


def main() -> None:
    """Alternate rounds of the two sides and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.serverwrite")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4000, help="per connection")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=("direct", "public"), help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.total)
        return
    samples: dict[str, list[float]] = {"direct": [], "public": []}
    for _ in range(args.rounds):
        for mode in ("direct", "public"):
            us = measure(mode, args.connections, args.requests)
            samples[mode].append(us)
            sys.stdout.write(f"{mode}: {us:.2f} µs CPU per request\n")
    best = {mode: min(values) for mode, values in samples.items()}
    saving = 1 - best["direct"] / best["public"]
    sys.stdout.write(
        f"best: direct {best['direct']:.2f} µs, public {best['public']:.2f} µs; "
        f"direct sends save {saving:.1%} of the server's CPU per request\n"
    )
    sys.stdout.write(
        "BENCHJSON " + json.dumps({"best_us": best, "samples_us": samples, "saving": saving}) + "\n"
    )


if __name__ == "__main__":
    main()
