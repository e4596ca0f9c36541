"""An in-memory harness for the simulated engine: a MemoryReactorClock, StringTransports."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.testing import MemoryReactorClock, StringTransport

from nvpair.proxy.testing.fakeengine.connection import EngineConnection, dechunk
from nvpair.proxy.testing.fakeengine.server import memoryConnection
from nvpair.proxy.testing.simengine import SimConfig, SimEngine


def post(path: bytes, doc: object) -> bytes:
    """A raw HTTP/1.1 POST of a JSON document."""
    body = json.dumps(doc).encode()
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)


def get(path: bytes) -> bytes:
    """A raw HTTP/1.1 GET."""
    return b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path


def chat(system: str, *turns: str, **extra: object) -> dict[str, Any]:
    """A chat request: a system prompt and alternating user/assistant turns."""
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages, **extra}


def sentence(n: int, tag: str = "w") -> str:
    """``n`` distinct words."""
    return " ".join(f"{tag}{i}" for i in range(n))


class Answer:
    """One parsed HTTP answer: status, headers (lower-cased names), body (de-chunked)."""

    def __init__(self, raw: bytes) -> None:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split(b" ")[1])
        self.headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip()
        if self.headers.get(b"transfer-encoding") == b"chunked":
            decoded = dechunk(rest, 0)
            assert decoded is not None, "an incomplete chunked body"
            self.body = decoded[0]
        else:
            self.body = rest[: int(self.headers.get(b"content-length", b"0"))]

    def json(self) -> Any:
        """The body as JSON (``Any``: tests reach into it)."""
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The JSON events of an SSE or NDJSON stream (without ``[DONE]``)."""
        out = []
        for line in self.body.split(b"\n"):
            line = line.strip()
            if line.startswith(b"data: "):
                line = line[6:]
            if line and line != b"[DONE]":
                out.append(json.loads(line))
        return out


class Harness:
    """A SimEngine on a MemoryReactorClock and a way to talk to it."""

    def __init__(self, **settings: Any) -> None:
        self.clock = MemoryReactorClock()
        self.engine = SimEngine(self.clock, SimConfig(**settings))
        self.engine.listen(8081)

    def connect(self) -> tuple[EngineConnection, StringTransport]:
        """A new client connection."""
        return memoryConnection(self.clock)

    def send(self, raw: bytes) -> tuple[EngineConnection, StringTransport]:
        """Send one request on a new connection."""
        connection, transport = self.connect()
        connection.dataReceived(raw)
        return connection, transport

    def exchange(self, raw: bytes, seconds: float = 600.0) -> Answer:
        """Send one request and run the clock until it is answered (at most ``seconds``)."""
        _, transport = self.send(raw)
        self.runUntil(lambda: _complete(transport.value()), seconds)
        return Answer(transport.value())

    def runUntil(self, done: Any, seconds: float) -> None:
        """Advance the clock from one delayed call to the next until ``done()`` (bounded by
        ``seconds`` of simulated time)."""
        deadline = self.clock.seconds() + seconds
        self.clock.advance(0)
        while not done():
            calls = self.clock.getDelayedCalls()
            if not calls:
                raise AssertionError("nothing scheduled and not done")
            nextTime = min(call.getTime() for call in calls)
            if nextTime > deadline:
                raise AssertionError("not done in time")
            self.clock.advance(nextTime - self.clock.seconds())


def _complete(raw: bytes) -> bool:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    if b"Transfer-Encoding: chunked" in head:
        return rest.endswith(b"0\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(rest) >= int(line.split(b":")[1])
    return True
