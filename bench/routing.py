"""In-process micro-benchmark of the per-request routing work against fleets of growing size.

Per request: ``admit`` (route class + the body's model), ``Snapshot.owners``,
``orderCandidates``, ``placeReservation`` and ``ReservationMap.reserve``; the reservation is
released 32 requests later (32 requests in flight).  Fleets of 1, 100 and 1,000 nodes, every
node advertising the same 10,000 models (so every model has every node as an owner: the
worst case for ordering), each built once.  Two scheduler states are measured:
``standalone`` (no ``node/set-priority`` yet) and ``scheduled`` (a snapshot listing every
node with random ``pending`` loads).  Rounds alternate the fleets; prints ``BENCHJSON``.

    python -m bench.routing [--rounds 5] [--requests 20000] [--nodes 1,100,1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections import deque
from typing import Any

from nvpair.proxy.engines import LLAMACPP
from nvpair.proxy.routing.admission import Admitted, admit
from nvpair.proxy.routing.candidates import Snapshot, orderCandidates, placeReservation
from nvpair.proxy.routing.nodes import parseNodes
from nvpair.proxy.routing.reservations import NodeLoad, ReservationMap

PATH = b"/v1/chat/completions"
IN_FLIGHT = 32


def buildFleet(nodes: int, models: list[str]) -> tuple[Snapshot, float]:
    """A snapshot of ``nodes`` direct-engine nodes each advertising ``models``; build seconds."""
    raw = [
        {
            "id": f"node-{i:04d}",
            "self": False,
            "addresses": [f"http://127.0.0.1:{20000 + i}"],
            "models": list(models),
        }
        for i in range(nodes)
    ]
    started = time.perf_counter()
    snapshot = Snapshot(parseNodes({"nodes": raw}), LLAMACPP.normalize)
    return snapshot, time.perf_counter() - started


def reservationsFor(snapshot: Snapshot, scheduled: bool, rng: random.Random) -> ReservationMap:
    """A fresh reservation map, with a scheduler snapshot listing every node when asked."""
    reservations = ReservationMap()
    if scheduled:
        order = [node.id for node in snapshot.nodes]
        rng.shuffle(order)
        load = {nodeId: NodeLoad(rng.randrange(0, 4), 0.0) for nodeId in order}
        reservations.applyPriority(1, order, load)
    return reservations


def timeRequests(snapshot: Snapshot, reservations: ReservationMap, bodies: list[bytes]) -> float:
    """Route every body once; return µs per request."""
    held: deque[Any] = deque()
    engine = LLAMACPP
    gc.collect()
    started = time.perf_counter()
    for body in bodies:
        decision = admit(engine, b"POST", PATH, body)
        assert isinstance(decision, Admitted) and decision.model is not None
        owners = snapshot.owners(decision.model, False)
        ordered, pinApplied = orderCandidates(owners, None, reservations.rank)
        target = placeReservation(ordered, pinApplied, reservations)
        if target is not None:
            held.append(reservations.reserve(target.id))
            if len(held) > IN_FLIGHT:
                held.popleft().release()
    elapsed = time.perf_counter() - started
    while held:
        held.popleft().release()
    return elapsed / len(bodies) * 1e6


def timeAdmission(bodies: list[bytes]) -> float:
    """Admission alone (the part independent of the fleet); µs per request."""
    engine = LLAMACPP
    gc.collect()
    started = time.perf_counter()
    for body in bodies:
        admit(engine, b"POST", PATH, body)
    return (time.perf_counter() - started) / len(bodies) * 1e6


def main() -> None:
    """Build the fleets once, then time alternating rounds and print medians."""
    parser = argparse.ArgumentParser(prog="python -m bench.routing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--nodes", default="1,100,1000")
    parser.add_argument("--models", type=int, default=10000)
    args = parser.parse_args()
    rng = random.Random(7)
    models = [f"org/model-{i:05d}-q4" for i in range(args.models)]
    bodies = [
        json.dumps(
            {"model": rng.choice(models), "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        for _ in range(args.requests)
    ]
    sizes = [int(n) for n in args.nodes.split(",")]
    fleets: dict[int, Snapshot] = {}
    build: dict[int, float] = {}
    for n in sizes:
        fleets[n], build[n] = buildFleet(n, models)
        sys.stderr.write(f"routing: built {n} nodes x {args.models} models in {build[n]:.1f}s\n")
    states = {
        (n, s): reservationsFor(fleets[n], s == "scheduled", rng)
        for n in sizes
        for s in ("standalone", "scheduled")
    }
    samples: dict[str, list[float]] = {}
    for n in sizes:  # warm the per-owner-set caches outside the timed rounds
        for s in ("standalone", "scheduled"):
            timeRequests(fleets[n], states[(n, s)], bodies[:200])
    for _ in range(args.rounds):
        samples.setdefault("admission", []).append(timeAdmission(bodies))
        for n in sizes:
            for s in ("standalone", "scheduled"):
                us = timeRequests(fleets[n], states[(n, s)], bodies)
                samples.setdefault(f"{s}:{n}", []).append(us)
    result = {
        "models": args.models,
        "requests": args.requests,
        "rounds": args.rounds,
        "build_s": {str(n): build[n] for n in sizes},
        "median_us": {k: statistics.median(v) for k, v in samples.items()},
        "samples_us": samples,
    }
    sys.stdout.write("BENCHJSON " + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
