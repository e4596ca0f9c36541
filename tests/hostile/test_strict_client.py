"""Engine responses held to RFC 9112 through the real process (issue 15, client side).

A raw engine on 127.0.0.1 answers every request with scripted bytes; the proxy runs as
``twistd -n nvpair-proxy`` under a scripted broker.  Malformed framing never reaches a client
as a success (the attempt fails before commit and the status table decides), a bare CR in an
engine header injects nothing, hop-by-hop fields and those ``Connection`` names are not
relayed, and a HEAD answer carries the engine's Content-Length.  Client heads are read as raw
bytes: an HTTP client library would hide the very fields under test.
"""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet import defer, protocol, reactor
from twisted.internet.address import IPv4Address
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IAddress
from twisted.trial.unittest import TestCase

from tests.support.cases.requestcase import FAST, asyncTest
from tests.support.harness import ProxyFixture, directNode, reservedPort, startEngine

_MAX_REQUEST = 1 << 16
CHAT = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}).encode()


class _RawEngineProtocol(protocol.Protocol):
    """Reads whole requests (head and Content-Length body) and answers each with the
    engine's current scripted bytes."""

    def __init__(self, engine: RawEngine) -> None:
        self.engine = engine
        self.buf = b""

    def connectionMade(self) -> None:
        self.engine.connections.append(self)

    def dataReceived(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > _MAX_REQUEST:
            self.transport.abortConnection()  # type: ignore[union-attr]
            return
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            lines = head.split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            method, path, _ = lines[0].split(" ", 2)
            self.engine.requests.append((method, path))
            self.transport.write(self.engine.answer)  # type: ignore[union-attr]


class RawEngine(protocol.ServerFactory):
    """An engine that answers every request with ``answer``, byte for byte."""

    def __init__(self, answer: bytes, models: tuple[str, ...] = ("m1",)) -> None:
        self.answer = answer
        self.models = list(models)
        self.requests: list[tuple[str, str]] = []
        self.connections: list[_RawEngineProtocol] = []
        self.url = ""

    def buildProtocol(self, addr: IAddress | None) -> _RawEngineProtocol:
        return _RawEngineProtocol(self)


def startRawEngine(test: TestCase, answer: bytes) -> RawEngine:
    """A raw engine listening on 127.0.0.1, closed (with its connections) when the test ends."""
    engine = RawEngine(answer)
    port = reactor.listenTCP(0, engine, interface="127.0.0.1")
    host = port.getHost()
    assert isinstance(host, IPv4Address)
    engine.url = f"http://127.0.0.1:{host.port}"

    def close() -> defer.Deferred[Any]:
        for conn in engine.connections:
            if conn.transport is not None:
                conn.transport.abortConnection()  # type: ignore[attr-defined]
        return defer.maybeDeferred(port.stopListening)

    test.addCleanup(close)
    return engine


class _Reader(protocol.Protocol):
    """A raw client: sends one request, collects the answer until the proxy closes."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.received = b""
        self.done: defer.Deferred[bytes] = defer.Deferred()
        self.marker: tuple[bytes, defer.Deferred[None]] | None = None

    def waitFor(self, marker: bytes) -> defer.Deferred[None]:
        """Fires once ``marker`` has been received."""
        d: defer.Deferred[None] = defer.Deferred()
        if marker in self.received:
            d.callback(None)
        else:
            self.marker = (marker, d)
        return d

    def connectionMade(self) -> None:
        self.transport.write(self.request)  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if self.marker is not None and self.marker[0] in self.received:
            d, self.marker = self.marker[1], None
            d.callback(None)

    def connectionLost(self, reason: object = None) -> None:
        self.done.callback(self.received)


async def rawRequest(port: int, method: str, path: str, body: bytes = b"") -> _Reader:
    """Send one request over a fresh connection (Connection: close)."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\n"
    )
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    reader = _Reader(head.encode() + b"\r\n" + body)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), reader)
    return reader


async def rawExchange(port: int, method: str, path: str, body: bytes = b"") -> bytes:
    """One request over a fresh connection (Connection: close); every byte answered."""
    reader = await rawRequest(port, method, path, body)
    answer: bytes = await reader.done.addTimeout(20, reactor)
    return answer


def parseAnswer(raw: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, header fields in order with lower-case names, body as sent)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields.append((name.strip().lower(), value.strip()))
    return int(lines[0].split(" ")[1]), fields, body


def field(fields: list[tuple[str, str]], name: str) -> list[str]:
    """The values of the field ``name`` (lower case)."""
    return [v for n, v in fields if n == name]


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
MALFORMED = {
    "signed length": OK + b"Content-Length: +256\r\n\r\n" + b"x" * 256,
    "length with an underscore": OK + b"Content-Length: 2_62\r\n\r\n" + b"x" * 262,
    "length and chunked": OK + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    "bad chunk size": OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    "bare CR in a value": OK + b"X-A: a\rTransfer-Encoding: chunked\r\n"
    b"Content-Length: 5\r\n\r\nhello",
}


class StrictEngineResponseTests(TestCase):
    """Engine answers through the real process."""

    timeout = 90

    async def proxyWith(self, nodes: list[dict[str, Any]], *argv: str) -> int:
        proxy = ProxyFixture(self, reactor, [*FAST, *argv])
        await proxy.start()
        port = await proxy.enable("llamacpp")
        await proxy.nodes("llamacpp", nodes)
        self.proxy = proxy
        return port

    @asyncTest
    async def test_signedLengthFailsOver(self) -> None:
        """A answers `Content-Length: +256`: the client gets B's 200, never A's."""
        bad = startRawEngine(self, MALFORMED["signed length"])
        good = startEngine(self, reactor, "openai", ["m1"], name="B")
        port = await self.proxyWith([directNode("A", bad), directNode("B", good)])  # type: ignore[arg-type]
        status, fields, body = parseAnswer(
            await rawExchange(port, "POST", "/v1/chat/completions", CHAT)
        )
        self.assertEqual(status, 200)
        self.assertEqual(field(fields, "x-nvpair-node"), ["B"])
        self.assertEqual(field(fields, "x-nvpair-attempts"), ["2"])
        self.assertNotIn(b"xxxx", body)
        self.assertEqual(json.loads(body)["choices"][0]["message"]["content"], "tok0tok1tok2")
        self.assertEqual(len(bad.requests), 1)

    @asyncTest
    async def test_malformedFramingNeverA200(self) -> None:
        """Each malformed answer from the only node: every attempt fails before commit and
        the client gets 502 upstream_unreachable, never a 200; each attempt dialled anew
        (a connection that broke the framing is never reused)."""
        bad = startRawEngine(self, b"")
        port = await self.proxyWith(
            [directNode("A", bad)],  # type: ignore[arg-type]
            "--max-dispatch-attempts",
            "2",
        )
        for what, answer in MALFORMED.items():
            bad.answer = answer
            before, connections = len(bad.requests), len(bad.connections)
            status, fields, body = parseAnswer(
                await rawExchange(port, "POST", "/v1/chat/completions", CHAT)
            )
            self.assertEqual(status, 502, what)
            self.assertIn("upstream_unreachable", body.decode("latin-1"), what)
            self.assertEqual(field(fields, "x-a"), [], what)
            self.assertEqual(len(bad.requests) - before, 2, what)
            self.assertEqual(len(bad.connections) - connections, 2, what)

    @asyncTest
    async def test_bareCRInjectsNoField(self) -> None:
        """An engine value with a bare CR before `Transfer-Encoding`/`X-Injected`: the
        answer is refused, the client gets B's intact answer with no injected field."""
        bad = startRawEngine(self, OK + b"X-A: a\rX-Injected: 1\r\nContent-Length: 2\r\n\r\n{}")
        good = startEngine(self, reactor, "openai", ["m1"], name="B")
        port = await self.proxyWith([directNode("A", bad), directNode("B", good)])  # type: ignore[arg-type]
        status, fields, body = parseAnswer(
            await rawExchange(port, "POST", "/v1/chat/completions", CHAT)
        )
        self.assertEqual(status, 200)
        self.assertEqual(field(fields, "x-injected"), [])
        self.assertEqual(field(fields, "x-a"), [])
        self.assertEqual(field(fields, "x-nvpair-node"), ["B"])
        self.assertEqual(len(bad.requests), 1)

    @asyncTest
    async def test_hopByHopNotRelayed(self) -> None:
        """Connection and the fields it names, Keep-Alive, Proxy-Connection, TE, Trailer and
        Upgrade from the engine never reach the client; end-to-end fields do."""
        engine = startRawEngine(
            self,
            (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Connection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\n"
                b"Proxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X-Sum\r\n"
                b"Upgrade: websocket\r\nX-Public: p\r\nContent-Length: 2\r\n\r\n{}"
            ),
        )
        port = await self.proxyWith([directNode("A", engine)])  # type: ignore[arg-type]
        status, fields, body = parseAnswer(
            await rawExchange(port, "POST", "/v1/chat/completions", CHAT)
        )
        self.assertEqual((status, body), (200, b"{}"))
        self.assertEqual(field(fields, "x-public"), ["p"])
        self.assertEqual(field(fields, "content-length"), ["2"])
        for name in (
            "x-secret",
            "keep-alive",
            "proxy-connection",
            "te",
            "trailer",
            "upgrade",
            "transfer-encoding",
        ):
            self.assertEqual(field(fields, name), [], name)
        for value in field(fields, "connection"):  # the proxy's own, if any
            self.assertNotIn("x-secret", value.lower())

    @asyncTest
    async def test_headCarriesTheEnginesLength(self) -> None:
        """HEAD on a forwarded route: the engine's Content-Length reaches the client (not 0),
        with no body bytes."""
        engine = startRawEngine(
            self, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 256\r\n\r\n"
        )
        port = await self.proxyWith([directNode("A", engine)])  # type: ignore[arg-type]
        status, fields, body = parseAnswer(await rawExchange(port, "HEAD", "/health"))
        self.assertEqual(status, 200)
        self.assertEqual(field(fields, "content-length"), ["256"])
        self.assertEqual(body, b"")
        self.assertEqual(engine.requests, [("HEAD", "/health")])

    @asyncTest
    async def test_brokenChunkAfterCommitTruncates(self) -> None:
        """A broken chunk after the stream committed: the client has what was relayed and
        its connection ends without the chunked body's end (a visible truncation); the
        next request dials the engine anew."""
        engine = startRawEngine(
            self,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b"c\r\ndata: hello\n\r\n",
        )
        port = await self.proxyWith([directNode("A", engine)])  # type: ignore[arg-type]
        reader = await rawRequest(port, "POST", "/v1/chat/completions", CHAT)
        await reader.waitFor(b"data: hello\n").addTimeout(20, reactor)
        engine.connections[-1].transport.write(b"zz\r\n")  # type: ignore[union-attr]
        status, fields, body = parseAnswer(await reader.done.addTimeout(20, reactor))
        self.assertEqual(status, 200)
        self.assertEqual(field(fields, "transfer-encoding"), ["chunked"])
        self.assertIn(b"data: hello\n", body)
        self.assertFalse(body.endswith(b"0\r\n\r\n"), body)
        engine.answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        status, _, body = parseAnswer(await rawExchange(port, "POST", "/v1/chat/completions", CHAT))
        self.assertEqual((status, body), (200, b"{}"))
        self.assertEqual(len(engine.connections), 2)

    @asyncTest
    async def test_bytesAfterANoContentAnswer(self) -> None:
        """The engine answers 204 with a Content-Length and, in the same write, a whole
        second response: the client gets exactly the 204 (no body, nothing of the second),
        the engine connection is closed and counted on /metrics, and the next request is
        served over a new connection."""
        engine = startRawEngine(
            self,
            b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK",
        )
        opsPort = reservedPort(self)
        port = await self.proxyWith([directNode("A", engine)], "--ops-port", str(opsPort))  # type: ignore[arg-type]
        raw = await rawExchange(port, "GET", "/health")
        self.assertTrue(raw.startswith(b"HTTP/1.1 204 No Content\r\n"), raw)
        status, fields, body = parseAnswer(raw)
        self.assertEqual((status, body), (204, b""))
        self.assertEqual(raw.count(b"HTTP/1.1 "), 1, raw)
        self.assertNotIn(b"OK", raw, "nothing of the second response")
        self.assertEqual(field(fields, "content-length"), [])
        engine.answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        status, _, body = parseAnswer(await rawExchange(port, "GET", "/health"))
        self.assertEqual((status, body), (200, b"{}"))
        self.assertEqual(len(engine.connections), 2, "the first connection was not reused")
        response = await treq.get(f"http://127.0.0.1:{opsPort}/metrics", persistent=False)
        metrics = await response.text()
        self.assertIn("nvpair_proxy_upstream_bytes_after_answer_total 1.0", metrics)
        self.assertEqual(self.proxy.crashes, [])
