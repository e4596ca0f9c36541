"""In-process micro-benchmark of the upstream client's response parsing (``httpclient`` on llhttp).

No sockets: one ``HTTPClientConnection`` on a ``TCPStringTransport`` and a stand-in pool that
takes the connection back after each response.  Three cases, µs per response:

* ``json``: a typical non-streamed answer (10 headers, a 400-byte Content-Length body) in
  one read -- ``send``, the head and body, ``deliverBody``, the end;
* ``sse``: the chunked body of a 50-event SSE stream (plus usage and ``[DONE]``, as the fake
  engine sends it) in one ``dataReceived``, head excluded;
* ``sse7``: the same body in 7-byte reads.

Rounds alternate the cases; the best round's mean is reported (least disturbed by the rest
of the machine), with the median of rounds beside it.  Prints ``BENCHJSON`` last.

    python -m bench.clientparse [--rounds 7] [--iterations 2000]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.testing import StringTransport

from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.response import Response
from nvpair.proxy.testing.wire import TCPStringTransport

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\n{}"
JSON_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: 400\r\n"
    b"Date: Sun, 30 Nov 2026 10:40:00 GMT\r\n"
    b"Server: fake-engine/1.0\r\n"
    b"X-Request-Id: 6f1c2a9e-3d4b-4c5d-8e7f-001122334455\r\n"
    b"Access-Control-Allow-Origin: *\r\n"
    b"Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
    b"Access-Control-Allow-Headers: Content-Type, Authorization\r\n"
    b"Cache-Control: no-cache\r\n"
    b"Vary: Origin\r\n"
    b"\r\n"
)
JSON_BODY = b'{"choices":[' + b"x" * 386 + b"]}"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nX-Engine: e1\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def sseBody(events: int = 50) -> bytes:
    """The chunked body of a streamed chat answer as the fake engine frames it."""
    pieces = []
    for i in range(events):
        finish = '"stop"' if i == events - 1 else "null"
        pieces.append(
            b'data: {"id":"chatcmpl-e1","object":"chat.completion.chunk","created":1700000000,'
            b'"model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":"tok%d"},'
            b'"finish_reason":%s}]}\n\n' % (i, finish.encode())
        )
    pieces.append(
        b'data: {"id":"chatcmpl-e1","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"m1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":50,'
        b'"total_tokens":55}}\n\n'
    )
    pieces.append(b"data: [DONE]\n\n")
    framed = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]
    return b"".join(framed) + b"0\r\n\r\n"


class _Pool:
    """Takes a finished connection back (the pool's ``release``) and forgets lost ones."""

    def release(self, conn: HTTPClientConnection) -> None:
        pass

    def lost(self, conn: HTTPClientConnection) -> None:
        pass

    def bytesAfterAnswer(self, conn: HTTPClientConnection) -> None:
        pass


class _Body:
    """A body protocol that counts bytes and remembers the end."""

    __slots__ = ("size", "ended")

    def __init__(self) -> None:
        self.size = 0
        self.ended = False

    def makeConnection(self, transport: Any) -> None:
        pass

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)

    def connectionLost(self, reason: Any) -> None:
        self.ended = True


def _connection() -> HTTPClientConnection:
    conn = HTTPClientConnection(_Pool(), "k")  # type: ignore[arg-type]
    conn.makeConnection(TCPStringTransport())
    return conn


def _open(conn: HTTPClientConnection, head: bytes) -> tuple[defer.Deferred[Response], _Body]:
    """Send a request and feed ``head``; the response's body is delivered to a ``_Body``."""
    assert isinstance(conn.transport, StringTransport)
    conn.transport.clear()
    d: defer.Deferred[Response] = defer.Deferred()
    conn.send(REQUEST, b"POST", d)
    body = _Body()
    d.addCallback(lambda response: response.deliverBody(body))
    if head:
        conn.dataReceived(head)
    return d, body


def caseJson(iterations: int) -> float:
    """Seconds for ``iterations`` JSON answers (head and body in one read)."""
    conn = _connection()
    raw = JSON_HEAD + JSON_BODY
    start = time.perf_counter()
    for _ in range(iterations):
        _, body = _open(conn, b"")
        conn.dataReceived(raw)
    elapsed = time.perf_counter() - start
    assert body.ended and body.size == len(JSON_BODY), "the JSON answer did not end"
    return elapsed


def _caseSse(iterations: int, reads: list[bytes]) -> float:
    conn = _connection()
    total = 0.0
    size = len(b"".join(reads))
    for _ in range(iterations):
        _, body = _open(conn, SSE_HEAD)
        start = time.perf_counter()
        for data in reads:
            conn.dataReceived(data)
        total += time.perf_counter() - start
    assert body.ended and size > body.size > 0, "the SSE stream did not end"
    return total


def caseSse(iterations: int) -> float:
    """Seconds for ``iterations`` 50-event chunked bodies, each in one read."""
    return _caseSse(iterations, [sseBody()])


def caseSse7(iterations: int) -> float:
    """Seconds for ``iterations`` 50-event chunked bodies, each in 7-byte reads."""
    raw = sseBody()
    return _caseSse(iterations, [raw[i : i + 7] for i in range(0, len(raw), 7)])


CASES: dict[str, tuple[Callable[[int], float], int]] = {
    "json": (caseJson, 1),
    "sse": (caseSse, 1),
    "sse7": (caseSse7, 10),  # ~600 reads per body: fewer iterations
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args(argv)
    rounds: dict[str, list[float]] = {name: [] for name in CASES}
    for case, divisor in CASES.values():
        case(max(args.iterations // divisor // 10, 1))  # warm up
    for _ in range(args.rounds):
        for name, (case, divisor) in CASES.items():
            n = max(args.iterations // divisor, 1)
            gc.collect()
            rounds[name].append(case(n) / n * 1e6)
    result = {}
    for name, values in rounds.items():
        result[name] = {"best_us": min(values), "median_us": statistics.median(values)}
        print(f"{name:5s} best {min(values):8.2f} µs   median {statistics.median(values):8.2f} µs")
    print("BENCHJSON " + json.dumps(result))


if __name__ == "__main__":
    main()
