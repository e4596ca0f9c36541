"""The real process under a scripted broker (issue 2): channel, facades, admission, lifecycle."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
from typing import Any

import treq
from twisted.internet import defer, reactor, utils
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import ProcessProtocol, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.http_headers import Headers

from nvpair.supervisor.process import JSONRPCError
from tests.support.harness import ProxyFixture, directNode, freePort, startEngine

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
OPTIONS = [
    "--state-dir",
    "--cluster-dir",
    "--response-header-timeout",
    "--job-deadline",
    "--dial-timeout",
    "--max-dispatch-attempts",
    "--backoff-base",
    "--backoff-max",
    "--client-write-timeout",
    "--retry-after",
    "--max-body",
    "--log-level",
    "--ops-port",
    "--standalone",
    "--backend",
    "--engines",
]


def occupy(test: TestCase) -> int:
    """A listening socket on a free loopback port, closed when the test ends."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    test.addCleanup(s.close)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return int(s.getsockname()[1])


class FoundationTests(TestCase):
    """Each test runs one (or a few) real ``twistd -n nvpair-proxy`` processes."""

    timeout = 90

    async def assertCleanChannel(self, proxy: ProxyFixture) -> None:
        """Every stdout line was JSON-RPC and every stderr line a protocol log record."""
        self.assertEqual(proxy.protocolErrors, [])
        for record in await proxy.someLogs():
            self.assertNotEqual(record.get("level"), "raw", record)
            self.assertIn(record.get("level"), ("debug", "info", "warn", "error"), record)
            self.assertIsInstance(record.get("time"), (int, float), record)
            self.assertEqual(record.get("component"), "nvpair-proxy", record)
            self.assertIn("event", record)

    async def started(self, *argv: str, stateDir: str | None = None) -> ProxyFixture:
        proxy = ProxyFixture(self, reactor, argv, stateDir=stateDir)
        await proxy.start()
        return proxy

    async def test_enableAllThree(self) -> None:
        """All three facades enable on free ports with result, subscribe and ready."""
        proxy = await self.started()
        ports = {}
        for engine in ("ollama", "lmstudio", "llamacpp"):
            port = freePort()
            result = await proxy.request("facade/enable", {"engine": engine, "port": port})
            self.assertEqual(result, {"engine": engine, "port": port, "aliases": []})
            ready = await proxy.waitFor(f"{engine}:ready")
            self.assertEqual(ready, {"port": port, "aliases": []})
            ports[engine] = port
        await proxy.sync()
        for engine, port in ports.items():
            self.assertEqual(
                proxy.methods(f"{engine}:"), [f"{engine}:discovery:subscribe", f"{engine}:ready"]
            )
            response = await treq.get(f"http://127.0.0.1:{port}/v1/models", persistent=False)
            self.assertEqual(response.code, 200)
            self.assertEqual(await response.json(), {"object": "list", "data": []})
        again = await proxy.request("facade/enable", {"engine": "ollama", "port": freePort()})
        self.assertEqual(again["port"], ports["ollama"])
        await proxy.sync()
        self.assertEqual(proxy.methods("ollama:ready").count("ollama:ready"), 1)
        await self.assertCleanChannel(proxy)

    async def test_errorCodes(self) -> None:
        """Addressing and parameter errors answer the codes of protocol §3-§4."""
        proxy = await self.started()
        cases: list[tuple[str, dict[str, Any], int, str | None]] = [
            ("set-port", {"port": 1}, -32602, "no facade addressed"),
            ("ollama:set-port", {"port": 1}, -32004, "facade not enabled"),
            ("no/such-method", {}, -32601, None),
            ("facade/enable", {"engine": "vllm", "port": 1}, -32602, None),
            ("facade/enable", {"engine": "ollama", "port": 70000}, -32602, None),
            ("facade/enable", {"engine": "ollama"}, -32602, None),
        ]
        for method, params, code, message in cases:
            with self.assertRaises(JSONRPCError) as cm:
                await proxy.request(method, params)
            self.assertEqual(cm.exception.code, code, method)
            if message is not None:
                self.assertEqual(cm.exception.message, message)
        await proxy.request("node/set-priority", {"generation": 1, "order": [], "load": {}})
        self.assertEqual(proxy.methods(), [])
        await self.assertCleanChannel(proxy)

    async def test_setPortPersistsAcrossRestart(self) -> None:
        """A set-port survives a restart; ``ignorePersistedPort`` bypasses it."""
        stateDir = tempfile.mkdtemp(prefix="nvpair-state-")
        first = await self.started(stateDir=stateDir)
        await first.enable("ollama")
        moved = freePort()
        result = await first.request("ollama:set-port", {"port": moved})
        self.assertEqual(result, {"port": moved})
        await first.waitFor("ollama:ready", lambda p: p["port"] == moved)
        with open(os.path.join(stateDir, "proxy-port.json")) as f:
            self.assertEqual(json.load(f), {"port": moved})
        self.assertEqual(await first.stop(), 0)

        second = await self.started(stateDir=stateDir)
        self.assertEqual(await second.enable("ollama"), moved)
        response = await treq.get(f"http://127.0.0.1:{moved}/api/tags", persistent=False)
        self.assertEqual(response.code, 200)
        self.assertEqual(await second.stop(), 0)

        third = await self.started(stateDir=stateDir)
        requested = freePort()
        self.assertEqual(
            await third.enable("ollama", requested, ignorePersistedPort=True), requested
        )
        await self.assertCleanChannel(third)

    async def test_bindFailureIsolation(self) -> None:
        """A taken port fails that engine only (-32010 + ``<engine>:error``)."""
        proxy = await self.started()
        port = await proxy.enable("llamacpp")
        taken = occupy(self)
        with self.assertRaises(JSONRPCError) as cm:
            await proxy.request("facade/enable", {"engine": "lmstudio", "port": taken})
        self.assertEqual(cm.exception.code, -32010)
        self.assertEqual(cm.exception.data["engine"], "lmstudio")
        self.assertEqual(cm.exception.data["port"], taken)
        self.assertIsInstance(cm.exception.data["reason"], str)
        error = await proxy.waitFor("lmstudio:error")
        self.assertEqual(error["kind"], "bind")
        self.assertEqual(error["port"], taken)
        with self.assertRaises(JSONRPCError) as cm:
            await proxy.request("llamacpp:set-port", {"port": taken})
        self.assertEqual(cm.exception.code, -32010)
        response = await treq.get(f"http://127.0.0.1:{port}/v1/models", persistent=False)
        self.assertEqual(response.code, 200)
        await response.content()
        ok = await proxy.request("facade/enable", {"engine": "lmstudio", "port": freePort()})
        self.assertEqual(ok["engine"], "lmstudio")
        await self.assertCleanChannel(proxy)

    async def test_aliasOccupied(self) -> None:
        """An occupied alias is reported (kind alias) and the primary and other alias serve."""
        proxy = await self.started()
        taken = occupy(self)
        alias = freePort()
        result = await proxy.request(
            "facade/enable",
            {
                "engine": "ollama",
                "port": freePort(),
                "aliases": [f"127.0.0.1:{taken}", f"127.0.0.1:{alias}"],
            },
        )
        self.assertEqual(result["aliases"], [f"127.0.0.1:{alias}"])
        report = await proxy.waitFor("ollama:errors:report")
        self.assertEqual(report["kind"], "alias")
        for port in (result["port"], alias):
            response = await treq.get(f"http://127.0.0.1:{port}/api/tags", persistent=False)
            self.assertEqual(response.code, 200)
            self.assertEqual(await response.json(), {"models": []})
        await self.assertCleanChannel(proxy)

    async def test_corruptPortFile(self) -> None:
        """A corrupt persisted-port file is reported (kind state) and the requested port used."""
        stateDir = tempfile.mkdtemp(prefix="nvpair-state-")
        with open(os.path.join(stateDir, "llamacpp-proxy-port.json"), "w") as f:
            f.write("{not json")
        proxy = await self.started(stateDir=stateDir)
        port = freePort()
        self.assertEqual(await proxy.enable("llamacpp", port), port)
        report = await proxy.waitFor("llamacpp:errors:report")
        self.assertEqual(report["kind"], "state")
        await self.assertCleanChannel(proxy)

    async def test_junkInputSurvived(self) -> None:
        """Garbage, non-objects and a 2 MiB line are reported and the process still answers."""
        proxy = await self.started()
        proxy.process.writeRaw(b"this is not json\n")
        proxy.process.writeRaw(b"[1, 2, 3]\n")
        proxy.process.writeRaw(b"\xff\xfe\x00garbage\n")
        proxy.process.writeRaw(b'{"jsonrpc": "2.0", "id": 99999, "result": {}}\n')
        big = b"x" * (2 * 1024 * 1024) + b"\n"
        for i in range(0, len(big), 256 * 1024):
            proxy.process.writeRaw(big[i : i + 256 * 1024])
        proxy.notify("discovery:nodes", {"nodes": []})
        proxy.notify("ollama:discovery:nodes", {"nodes": []})
        await proxy.sync()
        reports = [p for m, p in proxy.notifications if m == "errors:report"]
        self.assertEqual(len(reports), 7, reports)
        self.assertEqual({r["kind"] for r in reports}, {"protocol"})
        port = await proxy.enable("llamacpp")
        self.assertIsInstance(port, int)
        await self.assertCleanChannel(proxy)

    async def test_admissionAnswers(self) -> None:
        """400, 413 and 502 ``no_owner`` in the engine's shape, no engine contacted."""
        engine = startEngine(self, reactor, "ollama", ["other:latest"], name="A")
        proxy = await self.started("--max-body", "2000")
        port = await proxy.enable("ollama")
        await proxy.nodes("ollama", [directNode("A", engine)])
        base = f"http://127.0.0.1:{port}"
        cases = [
            ("/api/chat", b'{"messages": []}', 400, "bad_request", "ollama"),
            ("/v1/chat/completions", b"[1]", 400, "bad_request", "openai"),
            ("/api/generate", b"not json", 400, "bad_request", "ollama"),
            (
                "/api/chat",
                json.dumps({"model": "m", "p": "x" * 5000}).encode(),
                413,
                "body_too_large",
                "ollama",
            ),
            (
                "/v1/completions",
                json.dumps({"model": "m", "p": "x" * 5000}).encode(),
                413,
                "body_too_large",
                "openai",
            ),
            ("/api/chat", b'{"model": "nope"}', 502, "no_owner", "ollama"),
            ("/v1/chat/completions", b'{"model": "nope"}', 502, "no_owner", "openai"),
        ]
        for path, body, status, reason, shape in cases:
            response = await treq.post(
                base + path,
                data=body,
                persistent=False,
                headers=Headers(
                    {"Content-Type": ["application/json"], "Origin": ["http://example.com"]}
                ),
            )
            doc = await response.json()
            self.assertEqual(response.code, status, path)
            if shape == "ollama":
                self.assertEqual(doc["reason"], reason)
                self.assertIsInstance(doc["error"], str)
            else:
                self.assertEqual(doc["error"]["code"], reason)
                self.assertEqual(doc["error"]["type"], "proxy_error")
            self.assertFalse(
                [
                    name
                    for name, _ in response.headers.getAllRawHeaders()
                    if name.lower().startswith(b"access-control-")
                ]
            )
        self.assertEqual(engine.requests, [])
        await proxy.sync()
        events = proxy.workloadEvents()
        self.assertEqual([m for m, _ in events], ["workload:submitted", "workload:errored"] * 2)
        first = events[1][1]
        self.assertEqual(
            (first["state"], first["error"], first["model"]), ("failed", "no_owner", "nope:latest")
        )
        await self.assertCleanChannel(proxy)

    async def logged(self, proxy: ProxyFixture, event: str, **fields: Any) -> None:
        """Wait (bounded) until a log record ``event`` with ``fields`` has arrived: stderr
        lines come from the proxy's writer thread and may trail the stdout answers."""

        def seen() -> bool:
            return any(
                r.get("event") == event and all(r.get(k) == v for k, v in fields.items())
                for r in proxy.logs
            )

        while not seen():
            waiter: defer.Deferred[None] = defer.Deferred()
            proxy.logWaiters.append(waiter)
            await waiter.addTimeout(20.0, reactor)

    async def test_logLevelAtRuntime(self) -> None:
        """``log/set-level`` changes what reaches stderr while running."""
        proxy = await self.started()
        await self.logged(proxy, "started")  # the startup records, written in order, are in
        await proxy.request("log/set-level", {"level": "error"})
        before = len(proxy.logs)
        await proxy.enable("ollama")
        await proxy.request("log/set-level", {"level": "debug"})
        port = await proxy.enable("llamacpp")
        await self.logged(proxy, "facade-enabled", port=port)
        self.assertEqual(
            [r.get("engine") for r in proxy.logs[before:] if r.get("event") == "facade-enabled"],
            ["llamacpp"],
        )
        await self.assertCleanChannel(proxy)

    async def test_exitOnStdinEOF(self) -> None:
        """Closing stdin makes the process exit 0 within 5 s (else it would be killed)."""
        proxy = await self.started()
        await proxy.enable("ollama")
        code = await proxy.process.stop(5.0)
        self.assertEqual(code, 0)
        await self.assertCleanChannel(proxy)

    async def test_exitOnSigterm(self) -> None:
        """SIGTERM makes the process exit 0."""
        proxy = await self.started()
        await proxy.enable("llamacpp")
        pid = proxy.process.pid
        assert pid is not None
        exited = proxy.process.whenExited()
        os.kill(pid, signal.SIGTERM)
        self.assertEqual(await exited, 0)
        await self.assertCleanChannel(proxy)

    async def test_malformedOption(self) -> None:
        """A malformed option exits 2 with one stderr line naming it and nothing on stdout."""
        out, err, code = await utils.getProcessOutputAndValue(
            TWISTD,
            ["-n", "--pidfile=", "nvpair-proxy", "--dial-timeout=abc"],
            env=dict(os.environ),
            path=tempfile.mkdtemp(prefix="nvpair-cwd-"),
        )
        self.assertEqual(code, 2)
        self.assertEqual(out, b"")
        lines = err.decode().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("dial-timeout", lines[0])

    async def test_help(self) -> None:
        """``twistd nvpair-proxy --help`` lists every option of §1."""
        out, err, code = await utils.getProcessOutputAndValue(
            TWISTD,
            ["nvpair-proxy", "--help"],
            env=dict(os.environ),
            path=tempfile.mkdtemp(prefix="nvpair-cwd-"),
        )
        text = out.decode()
        for option in OPTIONS:
            self.assertIn(option, text)


class _Standalone(ProcessProtocol):
    """Collects a standalone process's output and tells when a log event appears."""

    def __init__(self) -> None:
        self.stdout = b""
        self.stderr = b""
        self.ended: defer.Deferred[BaseException] = defer.Deferred()
        self.waiting: list[tuple[str, defer.Deferred[dict[str, Any]]]] = []
        self.records: list[dict[str, Any]] = []

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.closeStdin()

    def outReceived(self, data: bytes) -> None:
        self.stdout += data

    def errReceived(self, data: bytes) -> None:
        self.stderr += data
        *lines, rest = self.stderr.split(b"\n")
        for line in lines[len(self.records) :]:
            record = json.loads(line)
            self.records.append(record)
            for event, d in list(self.waiting):
                if record.get("event") == event:
                    self.waiting.remove((event, d))
                    d.callback(record)

    def waitFor(self, event: str) -> defer.Deferred[dict[str, Any]]:
        for record in self.records:
            if record.get("event") == event:
                return defer.succeed(record)
        d: defer.Deferred[dict[str, Any]] = defer.Deferred()
        self.waiting.append((event, d))
        return d.addTimeout(30, reactor)

    def processEnded(self, reason: Failure) -> None:
        value = reason.value
        assert value is not None
        self.ended.callback(value)


class StandaloneTests(TestCase):
    """``--standalone``: no broker, facades on their standalone (or persisted) ports."""

    timeout = 60

    async def test_standalone(self) -> None:
        """Runs with stdin closed, writes nothing on stdout, answers 502 no_owner."""
        engine = startEngine(self, reactor, "openai", ["m1"], name="L")
        stateDir = tempfile.mkdtemp(prefix="nvpair-state-")
        port = freePort()
        with open(os.path.join(stateDir, "llamacpp-proxy-port.json"), "w") as f:
            json.dump({"port": port}, f)
        proto = _Standalone()
        process = reactor.spawnProcess(
            proto,
            TWISTD,
            [
                TWISTD,
                "-n",
                "--pidfile=",
                "nvpair-proxy",
                "--standalone",
                "--engines",
                "llamacpp",
                "--ops-port",
                "0",
                "--state-dir",
                stateDir,
                "--backend",
                f"llamacpp={engine.url}",
            ],
            env=dict(os.environ),
            path=tempfile.mkdtemp(prefix="nvpair-cwd-"),
        )

        def kill() -> defer.Deferred[BaseException]:
            if not proto.ended.called:
                process.signalProcess("KILL")
            return proto.ended

        self.addCleanup(kill)
        enabled = await proto.waitFor("facade-enabled")
        self.assertEqual((enabled["engine"], enabled["port"]), ("llamacpp", port))
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "unknown-model"},
            persistent=False,
        )
        self.assertEqual(response.code, 502)
        doc = await response.json()
        self.assertEqual(doc["error"]["code"], "no_owner")
        self.assertFalse([r for r in engine.requests if r.method == "POST"])
        process.signalProcess("TERM")
        ended = await proto.ended
        self.assertEqual(getattr(ended, "exitCode", None), 0)
        self.assertEqual(proto.stdout, b"")
        for line in proto.stderr.splitlines():
            record = json.loads(line)
            self.assertEqual(record["component"], "nvpair-proxy")


class ShutdownTests(TestCase):
    """Stopping with work in flight."""

    timeout = 60

    async def test_inFlightCancelledOnEOF(self) -> None:
        """Stdin EOF with a request in flight: its workload ends cancelled and the exit is 0."""
        from nvpair.proxy.testing.fakeengine import Hang

        engine = startEngine(self, reactor, "openai", ["m1"], name="H")
        engine.script(Hang())
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("llamacpp")
        await proxy.nodes("llamacpp", [directNode("H", engine)])
        pending = treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m1"}, persistent=False
        )
        pending.addErrback(lambda f: None)
        await engine.waitForRequest(1)
        self.assertEqual(await proxy.process.stop(5.0), 0)
        await pending
        terminal = [
            (m, i)
            for m, i in proxy.workloadEvents()
            if m in ("workload:completed", "workload:errored")
        ]
        self.assertEqual(len(terminal), 1, proxy.workloadEvents())
        self.assertEqual(
            (terminal[0][0], terminal[0][1]["state"]), ("workload:errored", "cancelled")
        )
        self.assertEqual(proxy.protocolErrors, [])


class _Raw(Protocol):
    """Sends bytes on connect and records what comes back until the connection closes."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.received = b""
        self.closed: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.payload)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed.callback(None)


def lanAddress() -> str | None:
    """This host's non-loopback IPv4 address, if it has one (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        host = str(s.getsockname()[0])
    except OSError:
        return None
    finally:
        s.close()
    return None if host.startswith("127.") or host == "0.0.0.0" else host


class IngressTests(TestCase):
    """The first-byte switch of the real listener (protocol §8)."""

    timeout = 60

    async def rawExchange(self, host: str, port: int, payload: bytes) -> bytes:
        proto = _Raw(payload)
        endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=10)
        await connectProtocol(endpoint, proto)
        await proto.closed.addTimeout(30, reactor)
        return proto.received

    async def test_tlsRefusedWhenNotMember(self) -> None:
        """Without a cluster directory a TLS first byte is closed without an answer."""
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("ollama")
        hello = b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"
        self.assertEqual(await self.rawExchange("127.0.0.1", port, hello), b"")
        answer = await self.rawExchange(
            "127.0.0.1",
            port,
            b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 "), answer[:40])

    async def test_plaintextFromLanClosed(self) -> None:
        """A plaintext connection from a non-loopback address is closed without an answer."""
        host = lanAddress()
        if host is None:
            raise SkipTest("no non-loopback IPv4 address on this host")
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("llamacpp")
        answer = await self.rawExchange(host, port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(answer, b"")
