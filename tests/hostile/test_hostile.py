"""Hostile and broken clients against the real process (issue 8).

Slowloris is cut by ``--header-read-timeout``; a client that never reads its stream is cut by
``--client-write-timeout`` while another stream completes; a connection flood past
``--max-connections`` is refused at once and leaves no descriptor behind; oversized header
blocks get 431 and oversized bodies 413; a few hundred garbage lines on stdin leave the
process serving.
"""

from __future__ import annotations

import json
import os
import random

import treq
from twisted.internet import defer, reactor, task
from twisted.internet.interfaces import ITCPTransport
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nvpair.proxy.options import Options
from nvpair.proxy.testing.fakeengine import Answer
from tests.support.fakes.rawclient import RawClient, connect
from tests.support.harness import ProxyFixture, directNode, startEngine


def fds(pid: int) -> int:
    """Open descriptors of a process."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def closeAll(clients: list[RawClient]) -> defer.Deferred[list[tuple[bool, None]]]:
    """Abort every open raw client and wait for them to be gone."""
    waits = []
    for c in clients:
        if not c.gone and c.transport is not None:
            ITCPTransport(c.transport).abortConnection()
        waits.append(c.lost)
    return defer.DeferredList(waits)


class HostileClientTests(TestCase):
    """Each limit holds against the real process and the process stays usable."""

    timeout = 120

    async def proxyWith(self, *argv: str, chunks: int = 3) -> tuple[ProxyFixture, int, object]:
        engine = startEngine(self, reactor, "openai", ["m1"], name="A")
        engine.default = Answer(chunks=chunks)
        proxy = ProxyFixture(self, reactor, list(argv))
        await proxy.start()
        port = await proxy.enable("llamacpp")
        await proxy.nodes("llamacpp", [directNode("A", engine)])
        return proxy, port, engine

    async def chat(self, port: int) -> tuple[int, bytes]:
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m1", "stream": True, "messages": []},
            persistent=False,
        )
        return response.code, await treq.content(response)

    @defer.inlineCallbacks
    def test_slowloris(self):  # type: ignore[no-untyped-def]
        """Headers trickled forever are cut once the header-read timeout passes."""
        proxy, port, _ = yield defer.Deferred.fromCoroutine(
            self.proxyWith("--header-read-timeout", "1s")
        )
        client = RawClient()
        yield connect(port, client)
        client.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        started = reactor.seconds()
        sent = [0]

        def trickle() -> None:
            if not client.gone:
                client.send(b"X-%d: y\r\n" % sent[0])
                sent[0] += 1

        loop = task.LoopingCall(trickle)
        loop.clock = reactor
        loop.start(0.2)
        yield client.lost.addTimeout(20, reactor)
        loop.stop()
        elapsed = reactor.seconds() - started
        self.assertGreaterEqual(elapsed, 0.8)
        self.assertLess(elapsed, 15)
        self.assertEqual(client.received, b"")  # cut without an answer
        code, _ = yield defer.Deferred.fromCoroutine(self.chat(port))
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_neverReadingClient(self):  # type: ignore[no-untyped-def]
        """A client that stops reading is cut by the write deadline (workload cancelled)
        while another client's stream on the same facade completes."""
        proxy, port, engine = yield defer.Deferred.fromCoroutine(
            self.proxyWith("--client-write-timeout", "1s", chunks=200_000)
        )
        stuck = RawClient(reading=False)
        yield connect(port, stuck)
        body = json.dumps({"model": "m1", "stream": True, "messages": []}).encode()
        stuck.send(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        yield engine.waitForRequest(1)
        code, content = yield defer.Deferred.fromCoroutine(self.chat(port))
        self.assertEqual(code, 200)
        self.assertTrue(content.rstrip().endswith(b"data: [DONE]"))
        cancelled = yield defer.Deferred.fromCoroutine(
            proxy.waitFor(
                "workload:errored", lambda p: p["workloadInfo"]["state"] == "cancelled", 60
            )
        )
        self.assertEqual(cancelled["workloadInfo"]["scheduledOn"], "A")
        stuck.readAgain()  # the proxy has closed it
        yield stuck.lost.addTimeout(30, reactor)
        self.assertFalse(stuck.received.rstrip().endswith(b"0\r\n\r\n"))
        completed = [i for m, i in proxy.workloadEvents() if m == "workload:completed"]
        self.assertEqual(len(completed), 1)

    @defer.inlineCallbacks
    def test_connectionFlood(self):  # type: ignore[no-untyped-def]
        """Connections past ``--max-connections`` are closed at once; afterwards the process
        serves and its descriptors are back to where they were."""
        proxy, port, _ = yield defer.Deferred.fromCoroutine(
            self.proxyWith("--max-connections", "20", "--header-read-timeout", "30s")
        )
        pid = proxy.process.pid
        assert pid is not None
        code, _ = yield defer.Deferred.fromCoroutine(self.chat(port))
        self.assertEqual(code, 200)
        baseline = fds(pid)
        clients = []
        for _ in range(80):
            c = RawClient()
            clients.append(c)
            yield connect(port, c)
        # a round trip through the proxy's reactor: every accept has been handled
        yield proxy.sync()
        refused = [c for c in clients if c.gone]
        for _ in range(50):
            if len(refused) >= 60:
                break
            yield task.deferLater(reactor, 0.1, lambda: None)
            refused = [c for c in clients if c.gone]
        self.assertEqual(len(refused), 60)
        self.assertTrue(all(c.received == b"" for c in refused))
        self.assertLessEqual(fds(pid), baseline + 20 + 2)
        yield closeAll(clients)
        code, _ = yield defer.Deferred.fromCoroutine(self.chat(port))
        self.assertEqual(code, 200)
        for _ in range(50):
            if fds(pid) <= baseline + 1:
                break
            yield task.deferLater(reactor, 0.1, lambda: None)
        self.assertLessEqual(fds(pid), baseline + 1)

    @defer.inlineCallbacks
    def test_oversized(self):  # type: ignore[no-untyped-def]
        """A header block over ``--max-header-bytes`` gets 431, a body over ``--max-body``
        gets 413 ``body_too_large``; the process keeps serving."""
        proxy, port, engine = yield defer.Deferred.fromCoroutine(
            self.proxyWith("--max-header-bytes", "4096", "--max-body", "1000")
        )
        client = RawClient()
        yield connect(port, client)
        client.send(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(60))
            + b"\r\n"
        )
        yield client.lost.addTimeout(20, reactor)
        self.assertTrue(client.received.startswith(b"HTTP/1.1 431 "), client.received[:100])
        response = yield treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m1", "x": "y" * 2000},
            persistent=False,
        )
        body = yield response.json()
        self.assertEqual(response.code, 413)
        self.assertEqual(body["error"]["code"], "body_too_large")
        self.assertEqual(engine.requestCount, 0)
        code, _ = yield defer.Deferred.fromCoroutine(self.chat(port))
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_garbageOnStdin(self):  # type: ignore[no-untyped-def]
        """A few hundred generated bad lines on stdin: every one reported or answered with a
        documented error, and the process still answers the broker and serves HTTP."""
        proxy, port, _ = yield defer.Deferred.fromCoroutine(self.proxyWith())
        rng = random.Random(8)
        methods = [
            "facade/enable",
            "node/set-priority",
            "log/set-level",
            "ollama:set-port",
            "llamacpp:discovery:nodes",
            "llamacpp:node/select",
            "nope",
            "",
            "llamacpp:x",
            "llamacpp:node/set-local-backend",
            "errors:report",
            "workload:submitted",
        ]
        junk: list[object] = [
            None,
            1,
            -1,
            1e308,
            "x",
            [],
            {},
            [1, {"a": None}],
            True,
            "\u0000\ud7ff",
            2**70,
        ]
        lines = []
        for i in range(400):
            kind = rng.randrange(6)
            if kind == 0:
                lines.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))))
            elif kind == 1:
                lines.append(b"[" * rng.randrange(1, 5000))
            elif kind == 2:
                lines.append(b"x" * ((1 << 20) + rng.randrange(10)))
            else:
                msg: dict[str, object] = {
                    "jsonrpc": "2.0",
                    "method": rng.choice(methods),
                    "params": {
                        k: rng.choice(junk)
                        for k in (
                            "engine",
                            "port",
                            "nodes",
                            "level",
                            "generation",
                            "order",
                            "nodeId",
                            "url",
                        )
                        if rng.random() < 0.5
                    },
                }
                if kind != 3:  # ids that cannot collide with the supervisor's own
                    msg["id"] = rng.choice([None, 0.5, "x", [], {}, True, f"junk{i}"])
                if rng.random() < 0.1:
                    msg["params"] = rng.choice(junk)
                lines.append(json.dumps(msg).encode())
        for line in lines:
            proxy.process.writeRaw(line.replace(b"\n", b" ") + b"\n")
        level = yield proxy.request("log/set-level", {"level": "info"})
        self.assertEqual(level, {"level": "info"})
        code, _ = yield defer.Deferred.fromCoroutine(self.chat(port))
        self.assertEqual(code, 200)
        kinds = {p.get("kind") for m, p in proxy.notifications if m == "errors:report"}
        self.assertIn("protocol", kinds)
        self.assertNotIn("internal", kinds)
        self.assertEqual(proxy.crashes, [])
        self.assertFalse(
            [
                r
                for r in proxy.logs
                if r.get("level") in ("error", "critical") or "Traceback" in json.dumps(r)
            ]
        )


class DefaultsTests(SynchronousTestCase):
    """The client limits default to sensible values (documented in spec.md §2)."""

    def test_defaults(self) -> None:
        """4096 connections, 30 s header read, 64 KiB headers, 60 s write, 64 MiB body."""
        options = Options({})
        options.parseOptions([])
        s = options.settings
        assert s is not None
        self.assertEqual(
            (
                s.maxConnections,
                s.headerReadTimeout,
                s.maxHeaderBytes,
                s.clientWriteTimeout,
                s.maxBody,
            ),
            (4096, 30.0, 65536, 60.0, 64 * 1024 * 1024),
        )
