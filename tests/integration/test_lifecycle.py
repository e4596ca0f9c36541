"""The real process's life beyond the broker's script: ``--standalone`` with no broker (stdin
closed, nothing on stdout) and stopping with a request in flight (issue 2)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.integration.processkit import TWISTD
from tests.support.harness import ProxyFixture, directNode, freePort, startEngine


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
