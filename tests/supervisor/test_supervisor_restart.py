"""Tests for nvpair.supervisor.process: supervision, restarts and the replay of broker state."""

from __future__ import annotations

from twisted.application.internet import backoffPolicy

from nvpair.proxy.broker import jsonrpc
from nvpair.supervisor.process import (
    ExitInfo,
    JSONRPCError,
    ProcessGone,
    ProxyProcess,
    RequestTimeout,
)
from tests.support.fakeprocess import FakeProcessTransport, Harness


class SuperviseTests(Harness):
    """Crash reporting, restart with backoff, and replay of broker-owned state."""

    def configure(self, proxy: ProxyProcess, transport: FakeProcessTransport) -> None:
        """Drive a realistic configuration through the proxy, answering each request."""
        d = proxy.request("facade/enable", {"engine": "ollama", "port": 0, "aliases": ["a"]})
        transport.answer({"engine": "ollama", "port": 11434, "aliases": ["a"]})
        self.successResultOf(d)
        d = proxy.request(
            "facade/enable", {"engine": "llamacpp", "port": 8090, "ignorePersistedPort": True}
        )
        transport.answer({"engine": "llamacpp", "port": 8090, "aliases": []})
        self.successResultOf(d)
        d = proxy.request("facade/enable", {"engine": "lmstudio", "port": 1})
        transport.send(jsonrpc.error(transport.last()["id"], -32010, "bind failed"))
        self.failureResultOf(d, JSONRPCError)
        d = proxy.request("ollama:set-port", {"port": 0})
        transport.answer({"port": 11500})
        self.successResultOf(d)
        proxy.notify("llamacpp:discovery:nodes", {"nodes": [{"id": "old"}]})
        proxy.notify("ollama:node/set-local-backend", {"url": "http://127.0.0.1:11435"})
        proxy.notify("ollama:node/select", {"nodeId": "n1"})
        proxy.notify("ollama:discovery:nodes", {"nodes": [{"id": "n1"}]})
        proxy.notify("llamacpp:discovery:nodes", {"nodes": [{"id": "new"}]})
        proxy.notify("node/set-priority", {"generation": 1, "order": [], "load": {}})
        proxy.notify("node/set-priority", {"generation": 2, "order": ["n1"], "load": {}})
        proxy.notify("log/set-level", {"level": "debug"})
        proxy.notify("workload:whatever", {})

    def test_restartReplays(self) -> None:
        """After a crash the new process gets the handshake and replay, in order."""
        policy = backoffPolicy(initialDelay=2.0, factor=2.0, jitter=lambda: 0.0)
        proxy, old = self.started(restartPolicy=policy)
        self.configure(proxy, old)
        pending = proxy.request("m", {})
        self.successResultOf(proxy.whenRunning())
        old.end(3)
        running = proxy.whenRunning()
        self.failureResultOf(pending, ProcessGone)
        self.assertEqual(self.crashes, [ExitInfo(3, None)])
        self.assertIsNone(proxy.pid)
        self.reactor.advance(1.99)
        self.assertEqual(len(self.reactor.spawned), 1)
        self.reactor.advance(0.01)
        self.assertEqual(len(self.reactor.spawned), 2)
        new = self.reactor.transport
        self.assertEqual(new.messages(), [jsonrpc.request(7, "log/set-level", {"level": "debug"})])
        new.answer({})
        new.answer({"engine": "ollama", "port": 11500, "aliases": ["a"]})
        self.assertNoResult(running)
        new.answer({"engine": "llamacpp", "port": 8090, "aliases": []})
        self.successResultOf(running)
        self.assertEqual(
            new.messages(),
            [
                jsonrpc.request(7, "log/set-level", {"level": "debug"}),
                jsonrpc.request(
                    8, "facade/enable", {"engine": "ollama", "port": 11500, "aliases": ["a"]}
                ),
                jsonrpc.request(
                    9,
                    "facade/enable",
                    {"engine": "llamacpp", "port": 8090, "ignorePersistedPort": True},
                ),
                jsonrpc.notification("llamacpp:discovery:nodes", {"nodes": [{"id": "new"}]}),
                jsonrpc.notification("ollama:discovery:nodes", {"nodes": [{"id": "n1"}]}),
                jsonrpc.notification("ollama:node/select", {"nodeId": "n1"}),
                jsonrpc.notification(
                    "ollama:node/set-local-backend", {"url": "http://127.0.0.1:11435"}
                ),
                jsonrpc.notification(
                    "node/set-priority", {"generation": 2, "order": ["n1"], "load": {}}
                ),
                jsonrpc.notification("log/set-level", {"level": "debug"}),
            ],
        )
        self.assertEqual(self.crashes, [ExitInfo(3, None)])
        self.assertEqual(proxy.pid, 1001)

    def test_replayUsesLatestBoundPort(self) -> None:
        """The port a replayed enable bound becomes the port replayed next time."""
        proxy, old = self.started(restartPolicy=lambda attempt: 1.0)
        d = proxy.request("facade/enable", {"engine": "ollama", "port": 0})
        old.answer({"engine": "ollama", "port": 11434, "aliases": []})
        self.successResultOf(d)
        old.end(1)
        self.reactor.advance(1)
        second = self.reactor.transport
        second.answer({})
        self.assertEqual(second.last()["params"], {"engine": "ollama", "port": 11434})
        second.answer({"engine": "ollama", "port": 11999, "aliases": []})
        second.end(None, 11)
        self.reactor.advance(1)
        third = self.reactor.transport
        third.answer({})
        self.assertEqual(third.last()["params"], {"engine": "ollama", "port": 11999})
        self.assertEqual(self.crashes, [ExitInfo(1, None), ExitInfo(None, 11)])

    def test_logLevelRequestReplayed(self) -> None:
        """A successful log/set-level request is replayed as a request, awaited."""
        proxy, old = self.started(restartPolicy=lambda attempt: 1.0)
        d = proxy.request("log/set-level", {"level": "warn"})
        old.answer({})
        self.successResultOf(d)
        failed = proxy.request("log/set-level", {"level": "bogus"})
        old.send(jsonrpc.error(old.last()["id"], -32602, "bad level"))
        self.failureResultOf(failed, JSONRPCError)
        old.end(1)
        self.reactor.advance(1)
        new = self.reactor.transport
        running = proxy.whenRunning()
        new.answer({})
        self.assertNoResult(running)
        new.send(jsonrpc.error(new.last()["id"], -32602, "whatever"))
        self.successResultOf(running)
        self.assertEqual(
            [(m["method"], m["params"], "id" in m) for m in new.messages()],
            [
                ("log/set-level", {"level": "warn"}, True),
                ("log/set-level", {"level": "warn"}, True),
            ],
        )
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_notifyWhileDownIsReplayed(self) -> None:
        """A state notification sent while no process runs reaches the next one."""
        proxy, old = self.started(restartPolicy=lambda attempt: 1.0)
        old.end(1)
        proxy.notify("ollama:node/select", {"nodeId": None})
        self.reactor.advance(1)
        new = self.reactor.transport
        new.answer({})
        self.assertEqual(new.last(), jsonrpc.notification("ollama:node/select", {"nodeId": None}))
        self.successResultOf(proxy.whenRunning())

    def test_backoffAndReset(self) -> None:
        """Each failed restart waits longer; a successful start resets the attempt count."""
        policy = backoffPolicy(initialDelay=2.0, factor=3.0, jitter=lambda: 0.0)
        proxy, first = self.started(restartPolicy=policy)
        first.end(1)
        self.reactor.advance(2)
        self.reactor.transport.end(1)  # dies before its handshake
        self.reactor.advance(5.9)
        self.assertEqual(len(self.reactor.spawned), 2)
        self.reactor.advance(0.1)
        self.assertEqual(len(self.reactor.spawned), 3)
        self.reactor.transport.answer({})
        self.successResultOf(proxy.whenRunning())
        self.reactor.transport.end(1)
        self.reactor.advance(2)
        self.assertEqual(len(self.reactor.spawned), 4)
        self.assertEqual(len(self.crashes), 3)

    def test_restartHandshakeTimeout(self) -> None:
        """A restarted process that never answers is killed and counted as a crash."""
        proxy, first = self.started(restartPolicy=lambda attempt: 1.0, requestTimeout=5.0)
        first.end(1)
        self.reactor.advance(1)
        second = self.reactor.transport
        self.reactor.advance(5)
        self.assertEqual(second.signals, ["KILL"])
        self.assertEqual(len(self.flushLoggedErrors(RequestTimeout)), 1)
        second.end(None, 9)
        self.assertEqual(self.crashes, [ExitInfo(1, None), ExitInfo(None, 9)])
        self.reactor.advance(1)
        self.assertEqual(len(self.reactor.spawned), 3)

    def test_crashWithoutPolicy(self) -> None:
        """Without a restart policy a crash is reported once and nothing restarts."""
        proxy, transport = self.started()
        transport.end(0)
        self.assertEqual(self.crashes, [ExitInfo(0, None)])
        running = proxy.whenRunning()
        self.assertNoResult(running)
        self.reactor.advance(100)
        self.assertEqual(len(self.reactor.spawned), 1)
        self.assertEqual(self.successResultOf(proxy.stop()), 0)
        self.failureResultOf(running, ProcessGone)
