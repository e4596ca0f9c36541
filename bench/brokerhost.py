"""A scripted broker for the benchmark: one proxy process, one facade, one direct-engine node.

Run as ``python -m bench.brokerhost --engine-port N --facade-port P --state-dir D
[--max-connections C] [--log-level info] [--twistd PATH] [--request-timeout S]``.  It
spawns ``twistd -n nvpair-proxy`` (``PATH``: another ``twistd``, such as a wrapper that
runs it under valgrind) through ``nvpair.supervisor.process.ProxyProcess`` (exactly as the
broker does), enables the llama.cpp facade on port P, announces one direct-engine node
``E`` at the fake engine, waits for the proxy to apply it, and prints one JSON line
``{"port": P, "pid": <proxy pid>}``.  It then consumes the proxy's notifications (counting
them) until its own stdin closes or it gets SIGTERM, when it stops the proxy (close stdin,
kill after 10 s) and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.protocol import Protocol
from twisted.internet.stdio import StandardIO

from nvpair.supervisor.process import ProxyProcess


class _StdinWatch(Protocol):
    """Stop everything when the orchestrator closes our stdin."""

    def __init__(self, onClose: Any) -> None:
        self._onClose = onClose

    def connectionLost(self, reason: Any = None) -> None:
        self._onClose()


async def _main(args: argparse.Namespace) -> None:
    counts = {"notifications": 0, "logs": 0}
    env = dict(os.environ)
    env.pop("NVPAIR_STATE_DIR", None)
    argv = [
        "--state-dir",
        args.state_dir,
        "--max-connections",
        str(args.max_connections),
        "--log-level",
        args.log_level,
    ]
    proc = ProxyProcess(
        reactor,
        argv,
        env,
        path=args.state_dir,
        onLog=lambda record: counts.__setitem__("logs", counts["logs"] + 1),
        requestTimeout=args.request_timeout,
        executable=args.twistd,
    )

    def notified(method: str, params: Any) -> None:
        counts["notifications"] += 1

    proc.subscribe(lambda method: True, notified)
    await proc.start()
    result = await proc.request("facade/enable", {"engine": "llamacpp", "port": args.facade_port})
    node = {
        "id": "E",
        "self": False,
        "addresses": [f"http://127.0.0.1:{args.engine_port}"],
        "models": args.models.split(","),
    }
    proc.notify("llamacpp:discovery:nodes", {"nodes": [node]})
    await proc.request("log/set-level", {"level": args.log_level})  # round trip: applied
    port = result["port"] if isinstance(result, dict) else None
    sys.stdout.write(json.dumps({"port": port, "pid": proc.pid}) + "\n")
    sys.stdout.flush()

    stopping: list[bool] = []

    def stop() -> None:
        if stopping:
            return
        stopping.append(True)
        d = proc.stop(10.0)
        d.addBoth(lambda _: reactor.stop())

    StandardIO(_StdinWatch(stop), reactor=reactor)  # type: ignore[no-untyped-call,unused-ignore]
    signal.signal(signal.SIGTERM, lambda *_: reactor.callFromThread(stop))  # type: ignore[attr-defined]
    await defer.Deferred()  # run until stop() stops the reactor


def main() -> None:
    """Parse arguments and run the scripted broker until told to stop."""
    parser = argparse.ArgumentParser(prog="python -m bench.brokerhost")
    parser.add_argument("--engine-port", type=int, required=True)
    parser.add_argument("--facade-port", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--models", default="bench")
    parser.add_argument("--max-connections", type=int, default=20000)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--twistd", help="the twistd to run (a wrapper, for bench.instructions)")
    parser.add_argument("--request-timeout", type=float, default=60.0)
    args = parser.parse_args()

    def failed(f: Any) -> None:
        sys.stderr.write(f"brokerhost: {f.getErrorMessage()}\n")
        reactor.stop()

    d = defer.Deferred.fromCoroutine(_main(args))
    d.addErrback(failed)
    reactor.run()


if __name__ == "__main__":
    main()
