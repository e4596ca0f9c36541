"""The fake engine as a process, for benchmarks and demos::

    python -m nvpair.proxy.testing.fakeengine --port 0 --dialect openai --models a,b [--chunks 50]

prints one JSON line ``{"port": N}`` on stdout once listening, then serves until killed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from twisted.internet.interfaces import IReactorCore, IReactorTCP

from nvpair.proxy.testing.fakeengine.behaviours import Answer
from nvpair.proxy.testing.fakeengine.dialects import DIALECTS
from nvpair.proxy.testing.fakeengine.engine import FakeEngine

PROG = "python -m nvpair.proxy.testing.fakeengine"


def engineFromArgs(reactor: IReactorTCP, argv: Sequence[str]) -> FakeEngine:
    """Build and start listening a FakeEngine from command-line arguments."""
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dialect", choices=DIALECTS, default="openai")
    parser.add_argument("--models", default="m1")
    parser.add_argument("--name", default="engine")
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--record", action="store_true", help="keep every request in memory")
    args = parser.parse_args(list(argv))
    engine = FakeEngine(
        reactor,
        args.dialect,
        [m for m in args.models.split(",") if m],
        name=args.name,
        record=args.record,
    )
    engine.default = Answer(chunks=args.chunks, chunkDelay=args.chunk_delay)
    engine.listen(args.port)
    return engine


def main(argv: Sequence[str] | None = None) -> None:
    """Run a fake engine until killed, printing {"port": N} once listening."""
    from twisted.internet import reactor

    engine = engineFromArgs(IReactorTCP(reactor), sys.argv[1:] if argv is None else argv)
    sys.stdout.write(json.dumps({"port": engine.port}) + "\n")
    sys.stdout.flush()
    IReactorCore(reactor).run()
