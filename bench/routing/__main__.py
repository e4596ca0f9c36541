"""``python -m bench.routing``: the placement benchmark (see ``bench/README.md``).

    python -m bench.routing [--workload chat|agents|freeslot] [--real-llama-server]
        [--engines N] [--slots N] [--routers a,b,...] [--no-write] [workload options]

``chat`` (the default): tenants with long system prompts, users holding multi-turn
conversations (``workload``); ``agents``: apps whose agents share a system prompt and tools
and grow their sessions by tool results over ``/v1/messages`` (``agents``); ``freeslot``:
routed requests beside clients that bypass the router (``freeslot``). The engines' caches
together hold ``--cache-share`` (default 0.68) of the working set, spread over the engines
(``--cache-tokens`` sets it per engine instead). Why 0.68: in issue 23's measurement the
oracle that pins each tenant to one engine served 87 % of prompt tokens from cache; 0.68
is where it serves about 86 % here (4,051 tokens per engine → 67 %, 5,000 → 83 %, 5,500 →
86 %, 6,000 → 88 %, 8,103 → 90 %). The old rig: ``--cache-share 0.5``.

Direct clients in the chat workload (``--direct-engines N --direct-slots K``): the first N
engines have K slots held by clients that reach them directly (``direct``).

``--real-llama-server``: the chat workload on real llama-servers (``llamaserver``).

``--records DIR``: each router's requests as JSON lines (``DIR/<router>.jsonl``), with each
real llama-server's log beside them (``DIR/<router>-l0.log``, ...).

Results: ``bench/out/routing[-WORKLOAD].json`` and (unless ``--no-write``) a dated section
of ``bench/RESULTS.md``, put before the earlier runs of that workload, which are kept.
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
from bench.routing import agents, freeslot, sections
from bench.routing.client import Record, Replayer
from bench.routing.direct import Sampler, hold, measure
from bench.routing.llamaserver import startLlamaServers
from bench.routing.messages import AgentReplayer
from bench.routing.options import parseArgs
from bench.routing.records import writeRecords
from bench.routing.report import (
    HEADING,
    LABELS,
    markdown,
    statsFromRecords,
    summarize,
    writeSection,
)
from bench.routing.routers import (
    MODEL,
    EngineSettings,
    engineStats,
    proxyPlacement,
    routerAvailable,
    servesMessages,
    startEngines,
    startRouter,
)
from bench.routing.workload import Sizes, conversations


def _reset(url: str) -> None:
    request = urllib.request.Request(url + "/sim/reset", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        r.read()


def _engines(args: argparse.Namespace, settings: EngineSettings) -> list[procs.Server]:
    if args.real_llama_server:
        return startLlamaServers(args.engines, args.slots, args.llama_args)
    return startEngines(args.engines, settings)


async def _one(
    reactor: Any, name: str, args: argparse.Namespace, settings: EngineSettings, load: Any
) -> dict[str, Any]:
    """One router: fresh engines, the router, the workload ``load`` replayed, the figures."""
    why = routerAvailable(name)
    if why:
        return {"skipped": why}
    engines = _engines(args, settings)
    names = {f"http://127.0.0.1:{e.port}": e.name for e in engines}
    server = None
    try:
        server, choose = startRouter(name, engines, args.seed)
        if args.workload == "agents" and server is not None:
            why = servesMessages(server)
            if why:
                return {"skipped": why}
        if not args.real_llama_server:
            for e in engines:  # the routers' readiness probes are not the workload
                _reset(f"http://127.0.0.1:{e.port}")
        sampler = Sampler(engines)
        if args.workload == "freeslot" or args.direct_engines:
            if args.workload == "chat":
                hold(engines[: args.direct_engines], args.direct_slots)
            sampler.start()
        started, before = time.monotonic(), os.getloadavg()[0]
        records: list[Record]
        if args.workload == "agents":
            replayer = AgentReplayer(reactor, choose, MODEL, args.answer_tokens, names)
            records = await replayer.run(load)
        elif args.workload == "freeslot":
            direct = list(names)[: args.direct_engines]
            pick = Record(0, 0, 0)
            clients = freeslot.FreeSlotClients(
                reactor, lambda: choose(pick, 0), direct, MODEL, load, names
            )
            records = await clients.run()
        else:
            extra = {"temperature": 0, "ignore_eos": True} if args.real_llama_server else {}
            chat = Replayer(reactor, choose, MODEL, args.answer_tokens, names, extra)
            records = await chat.run(load)
        elapsed = time.monotonic() - started
        sampler.stop()
        if args.records is not None:
            writeRecords(args.records, name, records, engines if args.real_llama_server else [])
        if args.workload == "freeslot":
            summary = freeslot.summarize(records, sampler, args.decode_ms, load)
        else:
            if args.real_llama_server:
                stats = statsFromRecords(records, [e.name for e in engines])
            else:
                stats = [engineStats(e) for e in engines]
            who = args.apps if args.workload == "agents" else args.tenants
            summary = summarize(records, stats, who)
            if args.direct_engines:
                summary["direct"] = measure(
                    records, sampler, args.decode_ms, args.answer_tokens, args.wait_threshold
                )
        placed = None if server is None else proxyPlacement(server)
        if placed is not None:
            summary["proxy"] = placed
        summary["seconds"] = round(elapsed, 1)
        summary["load"] = [round(before, 1), round(os.getloadavg()[0], 1)]
        return summary
    finally:
        if server is not None:
            server.close()
        for e in engines:
            e.close()


def _workload(args: argparse.Namespace, results: dict[str, Any]) -> tuple[Any, int]:
    """The workload to replay, described in ``results``, and its working set in tokens."""
    if args.workload == "agents":
        a = agents.AgentSizes(
            apps=args.apps,
            agents=args.agents,
            turns=args.turns,
            systemWords=args.system_words,
            tools=args.tools,
            toolWords=args.tool_words,
            taskWords=args.task_words,
            resultWords=args.result_words,
            answerTokens=args.answer_tokens,
            think=args.think,
            ramp=args.ramp,
            seed=args.seed,
        )
        load = agents.sessions(a)
        results.update(workload=attrs.asdict(a), turns=sum(s.turns for s in load))
        results["prefixTokens"] = agents.prefixTokens(load[0]) if load else 0
        return load, agents.workingSet(a, load)
    if args.workload == "freeslot":
        f = freeslot.FreeSlotSizes(
            directEngines=args.direct_engines,
            longClients=args.long_clients,
            shortClients=args.short_clients,
            longTokens=args.long_tokens,
            shortTokens=args.short_tokens,
            promptWords=args.prompt_words,
            think=args.think,
            duration=args.duration,
            seed=args.seed,
        )
        results["workload"] = attrs.asdict(f)
        return f, 0
    c = Sizes(
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
    chats = conversations(c)
    results.update(workload=attrs.asdict(c), turns=c.tenants * c.users * c.turns)
    results["systemChars"] = len(chats[0].system) if chats else 0
    return chats, c.workingSet()


def _section(args: argparse.Namespace, results: dict[str, Any]) -> tuple[str, str]:
    """The section's text and the heading under which earlier runs are kept."""
    if args.workload == "agents":
        return sections.agentsMarkdown(results), sections.AGENTS_HEADING
    if args.workload == "freeslot":
        return freeslot.markdown(results, LABELS), freeslot.HEADING
    if args.real_llama_server:
        return sections.realMarkdown(results), sections.REAL_HEADING
    return markdown(results), HEADING


async def run(reactor: Any, args: argparse.Namespace) -> None:
    """Replay the workload through every router, report, write the section."""
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python -m bench.routing", *sys.argv[1:]]),
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.0f} at start",
        "routers": {},
    }
    load, working = _workload(args, results)
    cache = args.cache_tokens or max(
        args.block_size, int(working * args.cache_share / args.engines)
    )
    if args.workload == "freeslot" and not args.cache_tokens:
        cache = 65536  # no shared prefixes: the cache plays no part
    settings = EngineSettings(args.slots, cache, args.block_size, args.prefill_ms, args.decode_ms)
    results["engines"] = {"count": args.engines, **attrs.asdict(settings)}
    if args.real_llama_server:
        results["engines"].update(model="Gemma 3 270M Q4_K_M", llamaArgs=args.llama_args)
    if working:
        results.update(workingSet=working, cacheShare=cache * args.engines / working)
    if args.workload == "chat" and args.direct_engines:
        results["direct"] = {"engines": args.direct_engines, "slots": args.direct_slots}
    for name in args.routers.split(","):
        sys.stderr.write(f"routing ({args.workload}): {name} ...\n")
        summary = await _one(reactor, name, args, settings, load)
        results["routers"][name] = summary
        sys.stderr.write(f"routing ({args.workload}): {name}: {json.dumps(summary)}\n")
    suffix = (
        ""
        if args.workload == "chat" and not args.real_llama_server
        else "-" + ("real" if args.real_llama_server else args.workload)
    )
    os.makedirs(os.path.join(procs.ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(procs.ROOT, "bench", "out", f"routing{suffix}.json"), "w") as f:
        json.dump(results, f, indent=1)
    section, heading = _section(args, results)
    sys.stdout.write(section)
    if not args.no_write:
        writeSection(os.path.join(procs.ROOT, "bench", "RESULTS.md"), section, heading)


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    args = parseArgs(sys.argv[1:] if argv is None else argv)
    react(lambda reactor: Deferred.fromCoroutine(run(reactor, args)))


main()
