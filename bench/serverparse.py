"""In-process micro-benchmark of the facade's HTTP/1.1 server side (no sockets).

    .venv/bin/python -m bench.serverparse [--requests 50000] [--rounds 5]

A ``ServerChannel`` over a counting transport receives a typical chat-completion POST (five
headers and a small JSON body) in one read, and a door answers it at once with a 400-byte
body and the proxy's routing headers.  Prints the process CPU time per request (best round;
CPU rather than wall time, so that other work on a shared machine counts less) and
``BENCHJSON``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from twisted.internet.task import Clock
from zope.interface import implementer

from nvpair.proxy.http.interfaces import IDoor
from nvpair.proxy.http.site import FacadeSite

BODY = b'{"model":"m1","messages":[{"role":"user","content":"hello there"}]}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n"
    b"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY
ANSWER = b"x" * 400


class CountingTransport:
    """Takes the answers and counts their bytes."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def loseConnection(self) -> None:
        pass


@implementer(IDoor)
class AnsweringDoor:
    """Answers every request at once, the way a committed proxied answer is written."""

    def handle(self, request: Any) -> None:
        request.setResponseCode(200, b"OK")
        headers = request.responseHeaders
        headers.setRawHeaders(b"Content-Type", [b"application/json"])
        headers.setRawHeaders(b"Content-Length", [b"%d" % len(ANSWER)])
        headers.setRawHeaders(b"X-Nvpair-Node", [b"E"])
        headers.setRawHeaders(b"X-Nvpair-Attempts", [b"1"])
        request.write(ANSWER)
        request.finish()

    def crashed(self, request: Any, error: Exception) -> None:
        raise error


def main() -> None:
    """Time rounds of requests on one kept-alive connection."""
    parser = argparse.ArgumentParser(prog="python -m bench.serverparse")
    parser.add_argument("--requests", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    site = FacadeSite(AnsweringDoor(), Clock(), 1 << 20, 30.0, 65536)
    channel = site.buildProtocol(None)
    transport = CountingTransport()
    channel.makeConnection(transport)
    samples = []
    for _ in range(args.rounds):
        started = time.process_time()
        for _ in range(args.requests):
            channel.dataReceived(REQUEST)
        samples.append((time.process_time() - started) / args.requests * 1e6)
    best = min(samples)
    sys.stdout.write(f"request parsed and answered: {best:.2f} µs CPU (best of {args.rounds})\n")
    sys.stdout.write(
        "BENCHJSON " + json.dumps({"us_per_request": best, "samples_us": samples}) + "\n"
    )


if __name__ == "__main__":
    main()
