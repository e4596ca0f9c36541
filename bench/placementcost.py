"""In-process cost of standalone placement per request: key, place, record (``--affinity
prefix``), for a 20-message chat over four owners.

Per request: ``affinity.keyFor`` (digests of the message prefixes, and on branches that have
it the prefix index's block digests), ``Affinity.place`` (ordering the owners) and
``Affinity.served`` (recording the home).  The workload: ``--tenants`` tenants, each with a
system prompt of ``--system-words`` words, users each sending a 20-message chat (system
prompt, 19 alternating turns of ``--turn-words`` words); requests cycle over tenants and
users, so each finds its tenant's prefix cached.  With ``--states`` (where the branch has
them) the engines' states are fresh with free slots.  The same module runs against an older
checkout (``PYTHONPATH=/work/main``): it uses only the API both share.  Prints µs per
request in this process's CPU time (``time.process_time``: on a shared, loaded machine wall
time mostly measures the other processes), median and minimum of ``--rounds``, and
``BENCHJSON``.

    python -m bench.placementcost [--rounds 7] [--requests 5000] [--states]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from typing import Any

from twisted.internet.task import Clock

from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.placement.choose import Hold
from nvpair.proxy.placement.keys import keyFor
from nvpair.proxy.routing.candidates import Snapshot, orderCandidates
from nvpair.proxy.routing.nodes import parseNodes
from nvpair.proxy.routing.reservations import ReservationMap

PATH = b"/v1/chat/completions"
NODES = [
    "http://127.0.0.1:9001",
    "http://127.0.0.1:9002",
    "http://127.0.0.1:9003",
    "http://127.0.0.1:9004",
]


def documents(tenants: int, users: int, systemWords: int, turnWords: int) -> list[dict[str, Any]]:
    """One 20-message chat body per (tenant, user)."""
    docs = []
    for t in range(tenants):
        system = " ".join(f"t{t}w{i}" for i in range(systemWords))
        for u in range(users):
            messages = [{"role": "system", "content": system}]
            for turn in range(19):
                role = "user" if turn % 2 == 0 else "assistant"
                text = " ".join(f"u{u}t{turn}w{i}" for i in range(turnWords))
                messages.append({"role": role, "content": text})
            docs.append({"model": "m", "messages": messages})
    return docs


def measure(args: argparse.Namespace) -> float:
    """µs per request of key + place + record, one round."""
    clock = Clock()
    reservations = ReservationMap()
    ledger = states = None
    if args.states:
        ledger = RoomLedger(clock, {})
        states = EngineStates(clock, ledger)
        for node in NODES:
            states.record(node, EngineReport(busy=0, total=8), 1e9, "/slots")
            ledger.probed(node, 0, 8, 1e9)
    affinity = Affinity(clock, reservations, ledger, states)
    snapshot = Snapshot(
        parseNodes([{"id": n, "addresses": [n], "models": ["m"]} for n in NODES]), str
    )
    docs = documents(args.tenants, args.users, args.system_words, args.turn_words)
    owners = snapshot.owners("m", False)
    for doc in docs:  # warm: every tenant's prefix cached somewhere
        key = keyFor("llamacpp", "m", PATH, doc)
        assert key is not None
        ordered, _ = orderCandidates(owners, None, reservations.rank)
        chosen = affinity.place(ordered, key, "m", Hold.NONE, "llamacpp")
        assert chosen is not None
        affinity.served(key, chosen.node.id)
    count = len(docs)
    gc.collect()
    gc.disable()
    try:
        started = time.process_time()
        for i in range(args.requests):
            doc = docs[i % count]
            key = keyFor("llamacpp", "m", PATH, doc)
            assert key is not None
            ordered, _ = orderCandidates(owners, None, reservations.rank)
            chosen = affinity.place(ordered, key, "m", Hold.NONE, "llamacpp")
            assert chosen is not None
            affinity.served(key, chosen.node.id)
        elapsed = time.process_time() - started
    finally:
        gc.enable()
    return float(elapsed / args.requests * 1e6)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.placementcost")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--turn-words", type=int, default=30)
    p.add_argument("--states", action="store_true")
    args = p.parse_args()
    rounds = [measure(args) for _ in range(args.rounds)]
    median = statistics.median(rounds)
    least = min(rounds)
    shown = ", ".join(f"{r:.2f}" for r in rounds)
    print(f"placement per request: median {median:.2f} µs, min {least:.2f} µs ({shown})")
    document = {"median": round(median, 2), "min": round(least, 2), "states": args.states}
    print("BENCHJSON " + json.dumps(document))


if __name__ == "__main__":
    main()
