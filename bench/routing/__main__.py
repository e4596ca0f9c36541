"""``python -m bench.routing``: the placement benchmark (see ``bench/README.md``).

    python -m bench.routing [--tenants 12] [--users 4] [--turns 4] [--system-words 1500]
        [--think 3.0] [--engines 4] [--slots 4] [--cache-share 0.68] [--cache-tokens N]
        [--prefill-ms 0.3] [--decode-ms 5]
        [--direct-engines 0] [--direct-slots 3] [--wait-threshold 0.05]
        [--routers nvpair-prefix,nvpair-off,nginx,random,oracle,sglang,vllm] [--no-write]

The engines' caches together hold ``--cache-share`` (default 0.68) of the workload's working
set, spread over the engines (``--cache-tokens`` sets it per engine instead).  Why 0.68: in
issue 23's measurement the oracle that pins each tenant to one engine served 87 % of prompt
tokens from cache (SGLang's gateway 79 %); at half the working set (the default until
2026-12-02 02:25, 4,051 tokens per engine) the oracle reaches only 56–67 %, too low for the
issue's "≥ 80 %" target to be judged.  Calibrated with the oracle alone, other defaults
unchanged: 4,051 tokens → 67 %, 5,000 → 83 %, 5,500 → 86 %, 6,000 → 88 %, 8,103 → 90 %.
The old rig: ``--cache-share 0.5`` (or ``--cache-tokens 4051``).

Direct clients (``--direct-engines N --direct-slots K``): the first N engines have K slots
held by clients that reach them directly (``bench/routing/direct.py`` says what is measured).

Results: ``bench/out/routing.json`` and (unless ``--no-write``) a dated section "Placement:
multi-tenant chat, run of ..." of ``bench/RESULTS.md``, put before the earlier runs, which
are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.task import react

from bench import procs
from bench.routing.client import Replayer
from bench.routing.direct import Sampler, hold, measure
from bench.routing.report import markdown, summarize, writeSection
from bench.routing.routers import (
    MODEL,
    ROUTERS,
    EngineSettings,
    engineStats,
    proxyPlacement,
    routerAvailable,
    startEngines,
    startRouter,
)
from bench.routing.workload import Sizes, conversations

# The engines' caches together hold 68 % of the working set (5,510 tokens per engine with
# the default sizes): calibrated so that the oracle pinning each tenant to one engine
# serves about 86 % of prompt tokens from cache, as in issue 23's measurement (87 %).
CACHE_SHARE = 0.68


def parseArgs(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.routing")
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--users", type=int, default=4, help="per tenant")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=1500)
    p.add_argument("--question-words", type=int, default=40)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--think", type=float, default=3.0, help="mean seconds between turns")
    p.add_argument("--ramp", type=float, default=8.0, help="conversations start within this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--slots", type=int, default=4, help="per engine")
    p.add_argument(
        "--cache-tokens",
        type=int,
        default=0,
        help="per engine; 0: --cache-share of the working set",
    )
    p.add_argument(
        "--cache-share",
        type=float,
        default=CACHE_SHARE,
        help="the engines' caches together, as a share of the working set (0.5 before 02:25)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefill-ms", type=float, default=0.3)
    p.add_argument("--decode-ms", type=float, default=5.0)
    p.add_argument(
        "--direct-engines",
        type=int,
        default=0,
        help="direct-clients scenario: on this many engines (the first ones) ...",
    )
    p.add_argument(
        "--direct-slots", type=int, default=3, help="... this many slots are held directly"
    )
    p.add_argument(
        "--wait-threshold",
        type=float,
        default=0.05,
        help="seconds of TTFT beyond the engine's own work that count as a wait",
    )
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    args = p.parse_args(argv)
    unknown = set(args.routers.split(",")) - set(ROUTERS)
    if unknown:
        p.error(f"unknown routers: {', '.join(sorted(unknown))} (known: {', '.join(ROUTERS)})")
    return args


def _reset(url: str) -> None:
    request = urllib.request.Request(url + "/sim/reset", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        r.read()


async def _one(
    reactor: Any,
    name: str,
    sizes: Sizes,
    settings: EngineSettings,
    n: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    why = routerAvailable(name)
    if why:
        return {"skipped": why}
    engines = startEngines(n, settings)
    server = None
    try:
        server, choose = startRouter(name, engines, sizes.seed)
        for e in engines:  # the routers' readiness probes are not the workload
            _reset(f"http://127.0.0.1:{e.port}")
        sampler = Sampler(engines)
        if args.direct_engines:
            hold(engines[: args.direct_engines], args.direct_slots)
            sampler.start()
        replayer = Replayer(reactor, choose, MODEL, sizes.answerTokens)
        started = time.monotonic()
        load = os.getloadavg()[0]
        records = await replayer.run(conversations(sizes))
        elapsed = time.monotonic() - started
        sampler.stop()
        summary = summarize(records, [engineStats(e) for e in engines], sizes.tenants)
        placed = None if server is None else proxyPlacement(server)
        if placed is not None:
            summary["proxy"] = placed
        summary["seconds"] = round(elapsed, 1)
        summary["load"] = [round(load, 1), round(os.getloadavg()[0], 1)]
        if args.direct_engines:
            summary["direct"] = measure(
                records, sampler, settings.decodeMs, sizes.answerTokens, args.wait_threshold
            )
        return summary
    finally:
        if server is not None:
            server.close()
        for e in engines:
            e.close()


async def run(reactor: Any, args: argparse.Namespace) -> None:
    """Replay the workload through every router, report, write the section."""
    sizes = Sizes(
        tenants=args.tenants,
        users=args.users,
        turns=args.turns,
        systemWords=args.system_words,
        questionWords=args.question_words,
        answerTokens=args.answer_tokens,
        think=args.think,
        ramp=args.ramp,
        seed=args.seed,
    )
    working = sizes.workingSet()
    cache = args.cache_tokens or max(
        args.block_size, int(working * args.cache_share / args.engines)
    )
    settings = EngineSettings(args.slots, cache, args.block_size, args.prefill_ms, args.decode_ms)
    os.makedirs(os.path.join(procs.ROOT, "bench", "out"), exist_ok=True)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python -m bench.routing", *sys.argv[1:]]),
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.0f} at start",
        "workload": attrs.asdict(sizes),
        "engines": {"count": args.engines, **attrs.asdict(settings)},
        "turns": sizes.tenants * sizes.users * sizes.turns,
        "workingSet": working,
        "cacheShare": cache * args.engines / working,
        "direct": {"engines": args.direct_engines, "slots": args.direct_slots}
        if args.direct_engines
        else None,
        "routers": {},
    }
    for name in args.routers.split(","):
        sys.stderr.write(f"routing: {name} ...\n")
        summary = await _one(reactor, name, sizes, settings, args.engines, args)
        results["routers"][name] = summary
        sys.stderr.write(f"routing: {name}: {json.dumps(summary)}\n")
    with open(os.path.join(procs.ROOT, "bench", "out", "routing.json"), "w") as f:
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
