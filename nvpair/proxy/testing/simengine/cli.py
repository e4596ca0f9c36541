"""The simulated engine as a process, for benchmarks, demos and integration tests::

    python -m nvpair.proxy.testing.simengine --port 0 --dialect llamacpp --models m \\
        --slots 4 --cache-tokens 65536 --block-size 16 --prefill-ms 0.5 --decode-ms 10

prints one JSON line ``{"port": N}`` on stdout once listening (as the fake engine does),
then serves until killed. Every flag is listed by ``--help``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from twisted.internet.interfaces import IReactorCore, IReactorTCP

from nvpair.proxy.testing.simengine.config import DIALECTS, Failure, SimConfig
from nvpair.proxy.testing.simengine.engine import SimEngine

PROG = "python -m nvpair.proxy.testing.simengine"


def parser() -> argparse.ArgumentParser:
    """The command line of the simulated engine."""
    p = argparse.ArgumentParser(prog=PROG, description="A simulated LLM inference engine.")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dialect", choices=DIALECTS, default="llamacpp")
    p.add_argument("--models", default="m", help="comma-separated model names")
    p.add_argument("--name", default="sim", help="shown in X-Fake-Engine and in answer ids")
    p.add_argument("--slots", type=int, default=4, help="requests processed at once")
    p.add_argument("--queue-max", type=int, default=64, help="FIFO bound; 503 beyond it")
    p.add_argument("--block-size", type=int, default=16, help="prefix cache block, in tokens")
    p.add_argument("--cache-tokens", type=int, default=65536, help="prefix cache capacity")
    p.add_argument("--prefill-ms", type=float, default=0.5, help="per uncached prompt token")
    p.add_argument("--decode-ms", type=float, default=10.0, help="per generated token")
    p.add_argument("--output-tokens", type=int, default=16, help="when max_tokens is unset")
    p.add_argument("--max-output-tokens", type=int, default=4096)
    p.add_argument("--ctx", type=int, default=8192, help="n_ctx: longest prompt + 1")
    p.add_argument("--no-slots", action="store_true", help="/slots answers 501")
    p.add_argument("--no-metrics", action="store_true", help="/metrics answers 501")
    p.add_argument("--loaded", default=None, help="models loaded at start (default: all)")
    p.add_argument(
        "--load-ms",
        default="0",
        help="to load a model not loaded: MS, or MS,NAME=MS,... (per model; one load at a time)",
    )
    p.add_argument("--max-loaded", type=int, default=0, help="models loaded at once (0: all)")
    p.add_argument("--keep-alive-s", type=float, default=300.0, help="unused model unloads")
    p.add_argument("--router", action="store_true", help="llamacpp: llama-server router mode")
    p.add_argument(
        "--no-models-autoload", action="store_true", help="router: requests never load a model"
    )
    p.add_argument(
        "--no-lmstudio-v1", action="store_true", help="lmstudio: no /api/v1 REST API (v0 only)"
    )
    p.add_argument("--fail-status", type=int, default=None, help="fail inference with this")
    p.add_argument("--fail-delay-ms", type=float, default=0.0)
    p.add_argument("--fail-retry-after", type=int, default=None)
    return p


def configFromArgs(argv: Sequence[str]) -> tuple[SimConfig, str, int]:
    """The engine's settings, host and port from command-line arguments (exit 2 if bad)."""
    p = parser()
    args = p.parse_args(list(argv))
    failure = None
    if args.fail_status is not None:
        if not 400 <= args.fail_status <= 599:
            p.error("--fail-status must be from 400 to 599")
        failure = Failure(args.fail_status, args.fail_delay_ms, args.fail_retry_after)
    loadMs, perModel = parseLoadMs(args.load_ms)
    if loadMs is None:
        p.error("--load-ms must be MS or MS,NAME=MS,... with non-negative numbers")
    if args.router and args.dialect != "llamacpp":
        p.error("--router is llama-server's router mode: --dialect llamacpp only")
    try:
        config = SimConfig(
            dialect=args.dialect,
            models=tuple(m for m in args.models.split(",") if m) or ("m",),
            name=args.name,
            slots=args.slots,
            queueMax=args.queue_max,
            blockSize=args.block_size,
            cacheTokens=args.cache_tokens,
            prefillMs=args.prefill_ms,
            decodeMs=args.decode_ms,
            outputTokens=args.output_tokens,
            maxOutputTokens=args.max_output_tokens,
            nCtx=args.ctx,
            slotsEndpoint=not args.no_slots,
            metricsEndpoint=not args.no_metrics,
            failure=failure,
            loaded=None if args.loaded is None else tuple(m for m in args.loaded.split(",") if m),
            loadMs=loadMs,
            loadMsPerModel=perModel,
            maxLoaded=args.max_loaded,
            keepAlive=args.keep_alive_s,
            router=args.router,
            autoload=not args.no_models_autoload,
            lmstudioV1=not args.no_lmstudio_v1,
        )
    except ValueError as e:
        p.error(str(e))
    return config, args.host, args.port


def parseLoadMs(value: str) -> tuple[float | None, tuple[tuple[str, float], ...]]:
    """``--load-ms``: a default and per-model times (``3000,big=9000``); None when bad."""
    default = 0.0
    perModel: list[tuple[str, float]] = []
    for part in (p.strip() for p in value.split(",")):
        name, sep, number = part.rpartition("=")
        try:
            ms = float(number)
        except ValueError:
            return None, ()
        if not ms >= 0 or (sep and not name):
            return None, ()
        if sep:
            perModel.append((name, ms))
        else:
            default = ms
    return default, tuple(perModel)


def engineFromArgs(reactor: IReactorTCP, argv: Sequence[str]) -> SimEngine:
    """Build a SimEngine from command-line arguments and start it listening."""
    config, host, port = configFromArgs(argv)
    engine = SimEngine(reactor, config)
    engine.listen(port, host)
    return engine


def main(argv: Sequence[str] | None = None) -> None:
    """Run a simulated engine until killed, printing {"port": N} once listening."""
    from twisted.internet import reactor

    engine = engineFromArgs(IReactorTCP(reactor), sys.argv[1:] if argv is None else argv)
    sys.stdout.write(json.dumps({"port": engine.port, "url": engine.url}) + "\n")
    sys.stdout.flush()
    IReactorCore(reactor).run()
