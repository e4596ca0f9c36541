"""Unit tests of the testing kit (nvpair.proxy.testing), in memory: no sockets, no real time.

The fake engine over real loopback sockets, and as a process, is tested in
test_integration_fakeengine and test_integration_fakeengine_process.
"""

from __future__ import annotations

import ast
import io
import json
import os
import sys

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy import testing
from nvpair.proxy.testing.fakeengine import (
    Answer,
    FakeEngine,
    IRequestHandler,
    Route,
    Status,
    document,
    engineFromArgs,
    streamPieces,
)
from nvpair.proxy.testing.fakeengine.connection import ConnectionState, EngineConnection
from nvpair.proxy.testing.fakeengine.server import memoryConnection
from nvpair.proxy.testing.wire import TCPStringTransport

CHAT = json.dumps({"model": "llama3", "messages": []}).encode()


def post(path: bytes, body: bytes) -> bytes:
    """A raw HTTP/1.1 POST with a Content-Length body."""
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)


class InMemoryEngineTests(SynchronousTestCase):
    """The engine on a MemoryReactorClock, its connections on StringTransports."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.engine = FakeEngine(self.reactor, "ollama", ["llama3"], name="mem")
        self.engine.listen(11434)

    def connect(self) -> tuple[EngineConnection, StringTransport]:
        """A new connection to the engine's listening factory."""
        return memoryConnection(self.reactor)

    def test_providesRequestHandler(self) -> None:
        """The engine is what its connections hand requests to."""
        self.assertTrue(verifyObject(IRequestHandler, self.engine))

    def test_listen(self) -> None:
        """listen asks the reactor for the port on loopback and names its URL."""
        port, _, _, interface = self.reactor.tcpServers[0]
        self.assertEqual((port, interface), (11434, "127.0.0.1"))
        self.assertEqual(self.engine.url, "http://127.0.0.1:11434")

    def test_noDelay(self) -> None:
        """A connection on a TCP transport turns Nagle's rule off, as Ollama (Go's default)
        and llama-server do: a token is never held for the peer's delayed ACK (about 20 ms
        more to the first token on a pooled connection, the proxy's)."""
        transport = TCPStringTransport()
        memoryConnection(self.reactor, transport)
        self.assertTrue(transport.noDelay)
        self.assertEqual(self.engine.openConnections, 1)

    def test_answerAndRecord(self) -> None:
        """A native chat streams NDJSON at once; the request is recorded."""
        connection, transport = self.connect()
        self.assertEqual(self.engine.openConnections, 1)
        connection.dataReceived(post(b"/api/chat", CHAT))
        head, _, body = transport.value().partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertIn(b"X-Fake-Engine: mem", head)
        self.assertIn(b"Content-Type: application/x-ndjson", head)
        self.assertTrue(body.endswith(b"0\r\n\r\n"))
        self.assertEqual(self.engine.requests[0].json()["model"], "llama3")
        self.assertIs(connection.state, ConnectionState.READING)
        self.assertFalse(transport.disconnecting)

    def test_pipelinedAndScripted(self) -> None:
        """Two pipelined requests take the scripted behaviour, then the default."""
        self.engine.script(Status(503, b"{}"))
        connection, transport = self.connect()
        connection.dataReceived(post(b"/api/chat", CHAT) * 2)
        self.assertEqual(transport.value().count(b"HTTP/1.1 "), 2)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 503 "))
        self.assertEqual(self.engine.requestCount, 2)

    def test_chunkDelayOnTheClock(self) -> None:
        """chunkDelay spaces the chunks on the reactor's clock."""
        self.engine.script(Answer(chunks=2, chunkDelay=1.0))
        connection, transport = self.connect()
        connection.dataReceived(post(b"/api/chat", CHAT))
        self.assertTrue(transport.value().endswith(b"\r\n\r\n"), "the head alone")
        self.assertIs(connection.state, ConnectionState.ANSWERING)
        self.reactor.advance(0)
        self.assertIn(b"tok0", transport.value())
        self.assertNotIn(b"tok1", transport.value())
        self.reactor.advance(1.0)
        self.assertIn(b"tok1", transport.value())
        self.assertIs(connection.state, ConnectionState.ANSWERING)
        self.reactor.advance(1.0)
        self.assertTrue(transport.value().endswith(b"\r\n0\r\n\r\n"))
        self.assertIs(connection.state, ConnectionState.READING)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_lostConnectionCancelsDelays(self) -> None:
        """A lost connection cancels its pending writes and fires the request's Deferred."""
        self.engine.script(Answer(chunks=2, chunkDelay=1.0))
        connection, transport = self.connect()
        connection.dataReceived(post(b"/api/chat", CHAT))
        lost = self.engine.requests[0].connectionLost
        connection.connectionLost()
        self.assertIs(connection.state, ConnectionState.CLOSED)
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.successResultOf(lost)
        self.assertEqual(self.engine.openConnections, 0)

    def test_closeWithoutConnections(self) -> None:
        """close stops listening and fires at once when nothing is connected."""
        self.successResultOf(self.engine.close())

    def test_connectionClose(self) -> None:
        """Connection: close closes the connection after the answer."""
        connection, transport = self.connect()
        connection.dataReceived(b"GET /api/tags HTTP/1.1\r\nConnection: close\r\n\r\n")
        self.assertIn(b'"name":"llama3"', transport.value())
        self.assertTrue(transport.disconnecting)


class DocumentTests(SynchronousTestCase):
    """The public document builders (bench/notify.py uses them)."""

    def test_document(self) -> None:
        """A chat document carries the model, the tokens and the usage."""
        doc = json.loads(document(Route.CHAT, "m", Answer(chunks=2), "e", 1))
        self.assertEqual(doc["model"], "m")
        self.assertEqual(doc["choices"][0]["message"]["content"], "tok0tok1")
        self.assertEqual(doc["usage"]["total_tokens"], 9)

    def test_streamPieces(self) -> None:
        """A chat stream is one event per chunk, a usage event, then [DONE]."""
        pieces = streamPieces(Route.CHAT, "m", Answer(chunks=2), "e")
        self.assertEqual(len(pieces), 4)
        self.assertEqual(pieces[-1], b"data: [DONE]\n\n")


class CLITests(SynchronousTestCase):
    """The command line, in process."""

    def test_help(self) -> None:
        """--help names the module to run and its options."""
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        with self.assertRaises(SystemExit):
            engineFromArgs(MemoryReactorClock(), ["--help"])
        usage = out.getvalue()
        self.assertIn("python -m nvpair.proxy.testing.fakeengine", usage)
        for option in ("--port", "--dialect", "--models", "--chunks", "--chunk-delay"):
            self.assertIn(option, usage)

    def test_engineFromArgs(self) -> None:
        """The options make the engine and its default answer."""
        reactor = MemoryReactorClock()
        engine = engineFromArgs(reactor, ["--port", "9001", "--dialect", "ollama", "--chunks", "5"])
        self.assertEqual((engine.dialect, engine.models, engine.port), ("ollama", ["m1"], 9001))
        self.assertEqual(engine.default, Answer(chunks=5))


class LayoutTests(SynchronousTestCase):
    """The kit is shipped: it must not need the tests (test_layout checks the other way)."""

    def imports(self, path: str) -> set[str]:
        """The modules a source file imports (absolute imports only)."""
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        return names

    def test_kitIndependentOfTests(self) -> None:
        """No kit module imports tests: the kit works where the tests are not installed."""
        kit = os.path.dirname(testing.__file__)
        checked = 0
        for folder, _, files in os.walk(kit):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    imported = self.imports(path)
                    bad = {m for m in imported if m == "tests" or m.startswith("tests.")}
                    self.assertEqual(bad, set(), path)
                    checked += 1
        self.assertGreaterEqual(checked, 10)
