"""``python -m bench.residency``: the residency benchmark (issue 33; ``bench/README.md``).

    python -m bench.residency [--nodes 3] [--models 5] [--clients 8] [--duration 75]
        [--think 0.5] [--zipf 1.0] [--max-loaded 2] [--load-ms 3000] [--slots 2]
        [--decode-ms 20] [--seed 1] [--runs 1] [--start-loaded m0;m1,m4;m2,m3]
        [--routers least-busy,warm-first,swapper,oracle,nvpair]
        [--no-write] [--records DIR]

Each router gets fresh engines that start empty (or holding what ``--start-loaded`` names:
a fleet whose layout is already wrong); the engines' counters are zeroed once the router is
ready, so its probes are not counted.  ``--runs N`` runs the workload with seeds ``seed`` to
``seed + N - 1``, every router in turn on each seed, and pools them: a closed loop's
timing makes one run's p90 jump where a tenth of its requests queued at all, so the
pooled requests say what a router does, and each seed's row says how far runs spread.
Results: ``bench/out/residency.json`` and (unless ``--no-write``) a dated section of
``bench/RESULTS.md`` before the earlier runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.task import react

from bench import procs
from bench.residency.client import Clients, Record, Router
from bench.residency.report import markdown, pooled, summarize, writeSection
from bench.residency.routers import (
    ROUTERS,
    EngineSettings,
    LeastBusy,
    Oracle,
    Proxy,
    WarmFirst,
    binPack,
    engineStats,
    proxyResidency,
    resetEngine,
    startEngines,
    startProxy,
)
from bench.residency.workload import Workload


def parseArgs(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.residency")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--models", type=int, default=5)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=75.0, help="seconds of load per router")
    p.add_argument("--think", type=float, default=0.5, help="mean seconds between requests")
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--max-loaded", type=int, default=2, help="models each node holds")
    p.add_argument("--load-ms", type=float, default=3000.0)
    p.add_argument("--slots", type=int, default=2, help="per engine")
    p.add_argument("--decode-ms", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=1, help="seeds seed.. seed+runs-1, pooled")
    p.add_argument(
        "--start-loaded",
        default="",
        metavar="LAYOUT",
        help="what each engine holds at start, engines by ';', models by ',': m0;m1,m4;m2,m3",
    )
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    p.add_argument(
        "--records", metavar="DIR", help="write each router's requests (JSON lines) in DIR"
    )
    args = p.parse_args(argv)
    unknown = set(args.routers.split(",")) - set(ROUTERS)
    if unknown:
        p.error(f"unknown routers: {', '.join(sorted(unknown))} (known: {', '.join(ROUTERS)})")
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


async def _one(
    reactor: Any,
    name: str,
    workload: Workload,
    settings: EngineSettings,
    nodes: int,
    recordsDir: str | None = None,
) -> Outcome:
    if name == "swapper":
        settings = attrs.evolve(settings, maxLoaded=1)
    engines = startEngines(nodes, workload.names(), settings)
    urls = [f"http://127.0.0.1:{e.port}" for e in engines]
    proxy = None
    warm = None
    router: Router
    try:
        if name == "nvpair":
            proxy, ops = startProxy(engines)
            router = Proxy(f"http://127.0.0.1:{proxy.port}")
        elif name == "warm-first":
            warm = WarmFirst(reactor, urls)
            warm.start()
            router = warm
        elif name == "oracle":
            held = binPack(workload.popularity(), nodes, settings.maxLoaded)
            router = Oracle(urls, workload.names(), held)
        else:
            router = LeastBusy(urls)
        for engine in engines:
            resetEngine(engine)
        started = time.monotonic()
        records = await Clients(reactor, router, workload).run()
        if recordsDir is not None:
            writeRecords(os.path.join(recordsDir, f"{name}-{workload.seed}.jsonl"), records)
        stats = [engineStats(e) for e in engines]
        summary = summarize(records, stats)
        summary["seconds"] = round(time.monotonic() - started, 1)
        if proxy is not None:
            summary["proxy"] = proxyResidency(ops)
        return Outcome(summary, records, stats)
    finally:
        if warm is not None:
            warm.stop()
        if proxy is not None:
            proxy.close()
        for engine in engines:
            engine.close()


@attrs.frozen
class Outcome:
    """One router's run: its summary, its requests and its engines' counters."""

    summary: dict[str, Any]
    records: list[Record]
    stats: list[dict[str, Any]]


def writeRecords(path: str, records: list[Record]) -> None:
    """Each request as one JSON line: its client, model, when it was sent (seconds from
    the first request), time to first token, the engine that served it and the load it
    waited for."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    start = min((r.sent for r in records), default=0.0)
    with open(path, "w") as f:
        for r in records:
            line = {"client": r.client, "model": r.model, "sent": round(r.sent - start, 3)}
            line.update(ttft=r.ttft, engine=r.engine, load=r.loadSeconds, status=r.status)
            f.write(json.dumps(line) + "\n")


async def run(reactor: Any, args: argparse.Namespace) -> None:
    """Run the workload through every router, report, write the section."""
    workload = Workload(
        models=args.models,
        clients=args.clients,
        duration=args.duration,
        think=args.think,
        zipf=args.zipf,
        answerTokens=args.answer_tokens,
        seed=args.seed,
    )
    settings = EngineSettings(args.slots, args.max_loaded, args.load_ms, args.decode_ms)
    if args.start_loaded:
        settings = attrs.evolve(settings, startLoaded=tuple(args.start_loaded.split(";")))
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python -m bench.residency", *sys.argv[1:]]),
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.0f} at start",
        "workload": attrs.asdict(workload),
        "engines": {"count": args.nodes, **attrs.asdict(settings)},
        "runs": [],
    }
    names = args.routers.split(",")
    outcomes: dict[str, list[Outcome]] = {name: [] for name in names}
    for seed in range(args.seed, args.seed + args.runs):
        seeded = attrs.evolve(workload, seed=seed)
        run: dict[str, Any] = {"seed": seed, "routers": {}}
        for name in names:
            sys.stderr.write(f"residency: {name}, seed {seed} ...\n")
            outcome = await _one(reactor, name, seeded, settings, args.nodes, args.records)
            outcomes[name].append(outcome)
            run["routers"][name] = outcome.summary
            sys.stderr.write(f"residency: {name}: {json.dumps(outcome.summary)}\n")
        results["runs"].append(run)
    results["routers"] = {
        name: pooled([(o.records, o.stats) for o in runs]) for name, runs in outcomes.items()
    }
    os.makedirs(os.path.join(procs.ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(procs.ROOT, "bench", "out", "residency.json"), "w") as f:
        json.dump(results, f, indent=1)
    section = markdown(results)
    sys.stdout.write(section)
    if not args.no_write:
        writeSection(os.path.join(procs.ROOT, "bench", "RESULTS.md"), section)


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    args = parseArgs(sys.argv[1:] if argv is None else argv)
    react(lambda reactor: Deferred.fromCoroutine(run(reactor, args)))


main()
