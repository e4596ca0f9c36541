"""Large bodies and the reactor (issue 32 item 5): a small chat's latency while a large body
is admitted, and the proxy's CPU and peak memory for one.

A real ``twistd -n nvpair-proxy --standalone`` over two minimal engines (``serveEngine``: a
threaded ``http.server`` that reads a body in one linear read and answers a fixed chat
completion; the kit's engines buffer a body by repeated concatenation, which takes longer
than the proxy for 60 MiB), all on 127.0.0.1.  For each body shape, each round sends one
large chat body on its own connection while this process sends small chats back to back
on others; the slowest small chat that overlapped the large one is the stall it caused.
Each shape runs in a fresh proxy process whose first large body goes alone: the proxy's
CPU seconds for it, and its resident memory sampled every 5 ms: the peak above the level
before it.

* ``tail``: ``messages`` first, ``model`` and the other fields after (the Python SDKs).
* ``head``: ``model`` first (curl, Codex).
* ``parsed``: 3.5 MiB, under both parse limits (8 MiB, 2^18 separators): parsed whole.

    python -m bench.bigbody [--mib 60] [--rounds 3] [--twistd PATH]

``--twistd`` runs another checkout's proxy (say main's ``.venv/bin/twistd``) for a before and
after.  Prints a Markdown table and a ``BENCHJSON`` line.  Every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import statistics
import sys
import threading
import time
from typing import Any

from bench import procs
from bench.procs import (
    MODEL,
    PYTHON,
    Server,
    cpuSeconds,
    freePort,
    rssKiB,
    spawn,
    spawnStandalone,
    waitForFleet,
    waitForPort,
)

SMALL = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
).encode()
PATH = "/v1/chat/completions"


ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()


class EngineHandler(http.server.BaseHTTPRequestHandler):
    """The minimal engine: model lists, and a fixed answer to any POST."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are two writes

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path in ("/v1/models", "/models"):
            self.answer(200, MODELS)
        else:
            self.answer(404, b'{"error": "not found"}')

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.answer(200, ANSWER)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serveEngine(port: int) -> None:
    """Run the minimal engine on 127.0.0.1:``port`` until killed."""
    http.server.ThreadingHTTPServer(("127.0.0.1", port), EngineHandler).serve_forever()


def startEngine() -> Server:
    """The minimal engine in a process of its own."""
    port = freePort()
    proc = spawn([PYTHON, "-m", "bench.bigbody", "--serve-engine", str(port)])
    waitForPort(port, "minimal engine", proc)
    return Server("engine", port, proc.pid, [proc])


def bigBody(mib: float, shape: str) -> bytes:
    """An agent's chat body of about ``mib`` MiB: a history of tool calls and their results
    (many small objects, as agents send), the other fields where ``shape`` says."""
    messages: list[dict[str, Any]] = []
    size, n = 0, 0
    while size < mib * (1 << 20):
        arguments = json.dumps({"cmd": f"ls -la src/{n}"})
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        pair: list[dict[str, Any]] = [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": "a.py\nb.py\nREADME\n" * 3},
        ]
        messages += pair
        size += len(json.dumps(pair))
        n += 1
    fields = {"model": MODEL, "stream": False, "max_tokens": 1, "user": "bench"}
    if shape == "head":
        return json.dumps({**fields, "messages": messages}).encode()
    return json.dumps({"messages": messages, **fields}).encode()


def request(port: int, body: bytes, timeout: float = 120) -> tuple[int, float]:
    """One POST on a new connection: (status, seconds until the answer was read)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - start
    finally:
        conn.close()


class Sampler(threading.Thread):
    """Samples a process's resident memory every 5 ms until stopped: the peak seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = rssKiB(pid)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.005):
            self.peak = max(self.peak, rssKiB(self.pid))


def round_(port: int, body: bytes) -> dict[str, Any]:
    """One large body with small chats around it."""
    result: dict[str, Any] = {}

    def big() -> None:
        result["status"], result["seconds"] = request(port, body)

    sender = threading.Thread(target=big, daemon=True)
    sender.start()
    small: list[float] = []
    deadline = time.monotonic() + 120
    while sender.is_alive() and time.monotonic() < deadline:
        status, seconds = request(port, SMALL, timeout=30)
        if status != 200:
            raise RuntimeError(f"a small chat got {status}")
        small.append(seconds)
    sender.join(5)
    return {
        "bigStatus": result.get("status"),
        "bigSeconds": result.get("seconds"),
        "smallMax": max(small) if small else None,
        "smallCount": len(small),
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--twistd", help="another checkout's twistd (a before/after)")
    parser.add_argument("--serve-engine", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_engine:
        serveEngine(args.serve_engine)
        return
    if args.twistd:
        procs.twistdCommand = lambda: [args.twistd]  # the same argv, another checkout
    engines = [startEngine(), startEngine()]
    shapes = {
        "tail": bigBody(args.mib, "tail"),
        "head": bigBody(args.mib, "head"),
        "parsed": bigBody(3.5, "tail"),
    }
    alone: list[float] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    first: dict[str, dict[str, float]] = {}
    try:
        for name, body in shapes.items():
            proxy = startProxy(engines)  # a fresh process: its first body's memory is clean
            try:
                alone += [request(proxy.port, SMALL)[1] for _ in range(10)]
                first[name] = firstBody(proxy, body)
                rows[name] = [round_(proxy.port, body) for _ in range(args.rounds)]
            finally:
                proxy.close()
        report(args, alone, shapes, rows, first)
    finally:
        for engine in engines:
            engine.close()


def startProxy(engines: list[Server]) -> Server:
    """The standalone proxy over ``engines``, once it sees both."""
    ops = freePort()
    proxy = spawnStandalone(
        [f"http://127.0.0.1:{e.port}" for e in engines], "--max-body", "67108864", opsPort=ops
    )
    waitForFleet(proxy, ops, 2)
    return proxy


def firstBody(proxy: Server, body: bytes) -> dict[str, float]:
    """A fresh process's first large body, alone: its CPU seconds and its peak resident
    memory above the level before it (MiB)."""
    before, cpu = rssKiB(proxy.pid), cpuSeconds(proxy.pid)
    sampler = Sampler(proxy.pid)
    sampler.start()
    request(proxy.port, body)
    sampler.stopping.set()
    sampler.join()
    return {"cpu": cpuSeconds(proxy.pid) - cpu, "peakMiB": (sampler.peak - before) / 1024}


def report(
    args: argparse.Namespace,
    alone: list[float],
    shapes: dict[str, bytes],
    rows: dict[str, list[dict[str, Any]]],
    first: dict[str, dict[str, float]],
) -> None:
    """The Markdown table and the ``BENCHJSON`` line."""
    print(
        f"small chat alone: p50 {statistics.median(alone) * 1000:.1f} ms, "
        f"max {max(alone) * 1000:.1f} ms ({len(alone)} requests)\n"
    )
    print(
        "| body | MiB | proxy CPU, first body (s) | peak RSS above start, first body (MiB) "
        "| status | small chat max during it (s), per round |"
    )
    print("|---|---|---|---|---|---|")
    for name, results in rows.items():
        stalls = ", ".join(
            f"{r['smallMax']:.3f}" if r["smallMax"] is not None else "-" for r in results
        )
        statuses = ",".join(str(r["bigStatus"]) for r in results)
        size = len(shapes[name]) / (1 << 20)
        once = first[name]
        print(
            f"| {name} | {size:.1f} | {once['cpu']:.2f} | {once['peakMiB']:.0f} | {statuses} "
            f"| {stalls} |"
        )
    print()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"load average (1 min) at the end: {load}\n")
    record = {"alone": alone, "rows": rows, "first": first, "twistd": args.twistd}
    print("BENCHJSON " + json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:])
