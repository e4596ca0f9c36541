"""A small asyncio client for streamed (SSE) chat completions, run as its own process.

Two modes, both loopback only and bounded in count and time; each prints one line
``BENCHJSON {...}`` with its results on stdout:

* ``load``: ``--conns`` keep-alive connections each send streaming requests back to back
  for ``--duration`` seconds (at most ``--max-streams`` in all); reports streams/s, time to
  the first body byte (TTFB) and to the end of the stream (p50/p99), and how many streams
  were incomplete (wrong number of SSE events or no terminating chunk).
* ``hold``: opens ``--streams`` concurrent streams (at most ``--connect-concurrency`` still
  waiting for their response headers at any time) and waits for all of them to finish
  within ``--timeout`` seconds; reports how many completed, the peak number open at once,
  and prints ``BENCHOPEN {...}`` once every stream has started so the caller can sample
  the proxy's memory with all streams held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

_END = b"\r\n0\r\n\r\n"


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[index]


def _dechunk(body: bytearray) -> bytes:
    """The payload of a complete chunked body (what is left unparsed is dropped)."""
    out = bytearray()
    pos = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            return bytes(out)
        try:
            size = int(bytes(body[pos:eol]).split(b";", 1)[0], 16)
        except ValueError:
            return bytes(out)
        if size == 0:
            return bytes(out)
        out += body[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one streamed response at a time."""

    def __init__(self, onLost: Any = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[bool] | None = None
        self.first: asyncio.Future[None] | None = None
        self.lost = False
        self._onLost = onLost
        self._reset()

    def _reset(self) -> None:
        self._head = b""
        self._inBody = False
        self._body = bytearray()
        self._length: int | None = None
        self._chunked = False
        self.status = 0
        self.sentAt = 0.0
        self.firstByteAt = 0.0
        self.headersAt = 0.0
        self.endAt = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, request: bytes) -> asyncio.Future[bool]:
        self._reset()
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        self.first = loop.create_future()
        self.sentAt = time.perf_counter()
        assert self.transport is not None
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self._inBody:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self._head[:end].split(b"\r\n")
            data = self._head[end + 4 :]
            self._head = b""
            self._inBody = True
            self.headersAt = now
            try:
                self.status = int(head[0].split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = 0
            for line in head[1:]:
                name, _, value = line.partition(b":")
                key = name.strip().lower()
                if key == b"content-length":
                    self._length = int(value.strip())
                elif key == b"transfer-encoding" and b"chunked" in value.lower():
                    self._chunked = True
        if data and not self.firstByteAt:
            self._firstByte(now)
        self._body += data
        if self._chunked:
            body = self._body
            if body.endswith(_END) or body == b"0\r\n\r\n":
                self._finish(now)
        elif self._length is not None and len(self._body) >= self._length:
            self._finish(now)

    def _firstByte(self, now: float) -> None:
        self.firstByteAt = now
        first, self.first = self.first, None
        if first is not None and not first.done():
            first.set_result(None)

    def _finish(self, now: float) -> None:
        self.endAt = now
        if not self.firstByteAt:
            self._firstByte(now)
        done, self.done = self.done, None
        if done is not None and not done.done():
            done.set_result(True)

    def events(self) -> int:
        """How many SSE ``data:`` events the last response carried (counted in the decoded
        body: a server that re-chunks the stream may split ``data:`` across chunks)."""
        return (_dechunk(self._body) if self._chunked else bytes(self._body)).count(b"data: ")

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._inBody and not self._chunked and self._length is None:
            self._finish(time.perf_counter())
        done, self.done = self.done, None
        if done is not None and not done.done():
            done.set_result(False)
        first, self.first = self.first, None
        if first is not None and not first.done():
            first.set_result(None)
        if self._onLost is not None:
            self._onLost(self)


def _request(host: str, port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _load(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    request = _request(args.host, args.port, args.path, args.body.encode())
    ttfb: list[float] = []
    total: list[float] = []
    counts = {"complete": 0, "incomplete": 0, "errors": 0, "streams": 0}
    deadline = time.perf_counter() + args.duration

    async def worker() -> None:
        conn: _Conn | None = None
        while time.perf_counter() < deadline and counts["streams"] < args.max_streams:
            if conn is None or conn.lost:
                try:
                    _, conn = await loop.create_connection(_Conn, args.host, args.port)
                except OSError:
                    counts["errors"] += 1
                    await asyncio.sleep(0.05)
                    continue
            counts["streams"] += 1
            try:
                ok = await asyncio.wait_for(conn.send(request), args.stream_timeout)
            except TimeoutError:
                ok = False
                assert conn.transport is not None
                conn.transport.abort()
                conn = None
            if not ok or conn is None:
                counts["errors"] += 1
                continue
            ttfb.append(conn.firstByteAt - conn.sentAt)
            total.append(conn.endAt - conn.sentAt)
            if conn.status == 200 and conn.events() == args.expect_events:
                counts["complete"] += 1
            else:
                counts["incomplete"] += 1
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.conns)))
    elapsed = time.perf_counter() - started
    return {
        **counts,
        "elapsed_s": elapsed,
        "streams_per_s": counts["complete"] / elapsed if elapsed > 0 else 0.0,
        "ttfb_p50_us": _percentile(ttfb, 50) * 1e6,
        "ttfb_p99_us": _percentile(ttfb, 99) * 1e6,
        "total_p50_us": _percentile(total, 50) * 1e6,
        "total_p99_us": _percentile(total, 99) * 1e6,
    }


async def _hold(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    request = _request(args.host, args.port, args.path, args.body.encode())
    gate = asyncio.Semaphore(args.connect_concurrency)
    state = {"open": 0, "peak": 0, "started": 0, "complete": 0, "incomplete": 0, "errors": 0}
    allStarted = asyncio.Event()
    started = time.perf_counter()
    ttfb: list[float] = []

    async def one() -> None:
        conn: _Conn | None = None
        async with gate:
            try:
                _, conn = await loop.create_connection(_Conn, args.host, args.port)
                done = conn.send(request)
                assert conn.first is not None
                await asyncio.wait_for(conn.first, args.timeout)
            except (TimeoutError, OSError):
                state["errors"] += 1
                return
        state["started"] += 1
        state["open"] += 1
        state["peak"] = max(state["peak"], state["open"])
        ttfb.append(conn.firstByteAt - conn.sentAt if conn.firstByteAt else float("nan"))
        if state["started"] + state["errors"] >= args.streams:
            allStarted.set()
        try:
            ok = await done
        finally:
            state["open"] -= 1
        if ok and conn.status == 200 and conn.events() == args.expect_events:
            state["complete"] += 1
        else:
            state["incomplete"] += 1
        if conn.transport is not None:
            conn.transport.close()

    async def announce() -> None:
        await allStarted.wait()
        line = {"open": state["open"], "at_s": time.perf_counter() - started}
        sys.stdout.write("BENCHOPEN " + json.dumps(line) + "\n")
        sys.stdout.flush()

    tasks = [asyncio.ensure_future(one()) for _ in range(args.streams)]
    announcer = asyncio.ensure_future(announce())
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), args.timeout)
        timedOut = False
    except TimeoutError:
        timedOut = True
    announcer.cancel()
    elapsed = time.perf_counter() - started
    return {
        **state,
        "streams": args.streams,
        "timed_out": timedOut,
        "all_complete": state["complete"] == args.streams,
        "elapsed_s": elapsed,
        "ttfb_p50_us": _percentile([t for t in ttfb if t == t], 50) * 1e6,
        "ttfb_p99_us": _percentile([t for t in ttfb if t == t], 99) * 1e6,
    }


def main() -> None:
    """Parse arguments, run one mode, print its ``BENCHJSON`` line."""
    parser = argparse.ArgumentParser(prog="python -m bench.streams")
    parser.add_argument("mode", choices=("load", "hold"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument(
        "--body",
        default='{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}',
    )
    parser.add_argument("--expect-events", type=int, required=True)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--max-streams", type=int, default=1_000_000)
    parser.add_argument("--stream-timeout", type=float, default=30.0)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    runner = _load if args.mode == "load" else _hold
    result = asyncio.run(runner(args))
    sys.stdout.write("BENCHJSON " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
