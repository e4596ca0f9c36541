"""The command line of ``python -m bench.routing``: one workload per run, its own defaults.

Options that every workload shares (engines, slots, costs, think time, routers) default to
``None`` and take the chosen workload's value from ``DEFAULTS`` unless given.
"""

from __future__ import annotations

import argparse

from bench.routing.routers import ROUTERS

WORKLOADS = ("chat", "agents", "freeslot")

DEFAULTS: dict[str, dict[str, object]] = {
    "chat": {
        "tenants": 12,
        "users": 4,
        "engines": 4,
        "slots": 4,
        "prefill_ms": 0.3,
        "decode_ms": 5.0,
        "think": 3.0,
        "turns": 4,
        "system_words": 1500,
        "routers": "nvpair-prefix,nvpair-off,nginx,random,oracle,sglang,vllm",
    },
    "agents": {
        "engines": 4,
        "slots": 4,
        "prefill_ms": 0.3,
        "decode_ms": 5.0,
        "think": 1.0,
        "turns": 8,
        "system_words": 1500,
        "routers": "nvpair-prefix,oracle,random,smg,sglang",
    },
    "freeslot": {
        "engines": 3,
        "slots": 2,
        "prefill_ms": 0.5,
        "decode_ms": 50.0,
        "think": 4.0,
        "routers": "nvpair-prefix,random",
    },
}
# Two real CPU llama-servers, 8 tenants with short system prompts (issue 31's third target).
REAL_DEFAULTS: dict[str, object] = {
    "engines": 2,
    "slots": 2,
    "tenants": 8,
    "users": 2,
    "turns": 4,
    "system_words": 100,
    "think": 3.0,
    "routers": "nvpair-prefix,sglang,random",
}
LLAMA_ARGS = "--ctx-size 16384 --swa-full --threads 1"


def parser() -> argparse.ArgumentParser:
    """Every option of every workload."""
    p = argparse.ArgumentParser(prog="python -m bench.routing")
    p.add_argument("--workload", choices=WORKLOADS, default="chat")
    p.add_argument("--tenants", type=int, default=None, help="chat: tenants (apps)")
    p.add_argument("--users", type=int, default=None, help="chat: per tenant")
    p.add_argument("--turns", type=int, default=None, help="chat turns, or model calls per agent")
    p.add_argument("--system-words", type=int, default=None)
    p.add_argument("--question-words", type=int, default=40)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--think", type=float, default=None, help="mean seconds between requests")
    p.add_argument("--ramp", type=float, default=8.0, help="conversations start within this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--records", metavar="DIR", help="write each router's requests (JSON lines) in DIR"
    )
    p.add_argument("--apps", type=int, default=6, help="agents: apps")
    p.add_argument("--agents", type=int, default=4, help="agents: per app")
    p.add_argument("--tools", type=int, default=8, help="agents: tool definitions per app")
    p.add_argument("--tool-words", type=int, default=150, help="agents: per tool description")
    p.add_argument("--task-words", type=int, default=40)
    p.add_argument("--result-words", type=int, default=200, help="agents: mean tool result")
    p.add_argument("--duration", type=float, default=60.0, help="freeslot: seconds of load")
    p.add_argument("--long-clients", type=int, default=2)
    p.add_argument("--short-clients", type=int, default=6)
    p.add_argument("--long-tokens", type=int, default=400)
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--prompt-words", type=int, default=60, help="freeslot: per request")
    p.add_argument("--engines", type=int, default=None)
    p.add_argument("--slots", type=int, default=None, help="per engine")
    p.add_argument(
        "--cache-tokens", type=int, default=0, help="per engine; 0: --cache-share of the set"
    )
    p.add_argument(
        "--cache-share",
        type=float,
        default=0.68,
        help="the engines' caches together, as a share of the working set (0.5 before 02:25)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefill-ms", type=float, default=None)
    p.add_argument("--decode-ms", type=float, default=None)
    p.add_argument(
        "--direct-engines",
        type=int,
        default=None,
        help="chat: slots held directly on this many engines; freeslot: direct clients",
    )
    p.add_argument("--direct-slots", type=int, default=3, help="chat: ... this many slots are held")
    p.add_argument(
        "--wait-threshold",
        type=float,
        default=0.05,
        help="chat: seconds of TTFT beyond the engine's own work that count as a wait",
    )
    p.add_argument(
        "--real-llama-server",
        action="store_true",
        help="chat: real llama-servers (.venv-llama-server) instead of simulated engines",
    )
    p.add_argument("--llama-args", default=LLAMA_ARGS, help="extra llama-server arguments")
    p.add_argument("--routers", default=None)
    p.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    return p


def parseArgs(argv: list[str]) -> argparse.Namespace:
    """The command line, each unset shared option filled from the workload's defaults."""
    p = parser()
    args = p.parse_args(argv)
    if args.real_llama_server and args.workload != "chat":
        p.error("--real-llama-server runs the chat workload only")
    defaults = REAL_DEFAULTS if args.real_llama_server else DEFAULTS[args.workload]
    for name, value in {**DEFAULTS[args.workload], **defaults}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.direct_engines is None:
        args.direct_engines = 2 if args.workload == "freeslot" else 0
    unknown = set(args.routers.split(",")) - set(ROUTERS)
    if unknown:
        p.error(f"unknown routers: {', '.join(sorted(unknown))} (known: {', '.join(ROUTERS)})")
    return args
