"""The real process under a scripted broker (issue 2): channel, facades, admission, lifecycle.

Starting without a broker and stopping with work in flight: ``test_lifecycle``; the listener's
first-byte switch: ``tests/fleet/test_ingress.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
from typing import Any

import treq
from twisted.internet import defer, reactor, utils
from twisted.trial.unittest import TestCase
from twisted.web.http_headers import Headers

from nvpair.supervisor.process import JSONRPCError
from tests.integration.processkit import TWISTD
from tests.support.harness import ProxyFixture, directNode, freePort, startEngine

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
