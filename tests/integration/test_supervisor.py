"""Supervision (issue 10): a crashed proxy is restarted, its facades and discovery replayed."""

from __future__ import annotations

import os
import signal

import treq
from twisted.application.internet import backoffPolicy
from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from tests.support.harness import ProxyFixture, directNode, startEngine


class SupervisorTests(TestCase):
    """The real proxy under ``ProxyProcess`` with a restart policy."""

    timeout = 90

    async def chat(self, port: int) -> int:
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
            persistent=False,
        )
        await response.content()
        return int(response.code)

    async def test_restartAfterKill(self) -> None:
        """After SIGKILL the crash is reported once and the facade serves again on its port."""
        engine = startEngine(self, reactor, "openai", ["m1"], name="A")
        proxy = ProxyFixture(
            self, reactor, restartPolicy=backoffPolicy(initialDelay=0.1, maxDelay=1, factor=2)
        )
        await proxy.start()
        port = await proxy.enable("llamacpp")
        await proxy.nodes("llamacpp", [directNode("A", engine)])
        self.assertEqual(await self.chat(port), 200)
        self.assertEqual(len(engine.requests), 1)

        pid = proxy.process.pid
        assert pid is not None
        exited = proxy.process.whenExited()
        os.kill(pid, signal.SIGKILL)
        self.assertIsNone(await exited)
        await proxy.process.whenRunning()

        self.assertEqual(len(proxy.crashes), 1)
        self.assertEqual(proxy.crashes[0].signal, signal.SIGKILL)
        self.assertEqual(proxy.process.crashes, 1)
        self.assertNotEqual(proxy.process.pid, pid)
        readies = [p for m, p in proxy.notifications if m == "llamacpp:ready"]
        self.assertEqual([r["port"] for r in readies], [port, port])
        await proxy.sync()
        self.assertEqual(await self.chat(port), 200)
        self.assertEqual(len(engine.requests), 2)
        self.assertEqual(proxy.protocolErrors, [])
        self.assertEqual(await proxy.stop(), 0)
        self.assertEqual(len(proxy.crashes), 1)

    async def test_movedPortRestored(self) -> None:
        """A facade moved with set-port comes back on the moved port after a crash."""
        from tests.support.harness import freePort

        engine = startEngine(self, reactor, "ollama", ["m1:latest"], name="B")
        proxy = ProxyFixture(
            self, reactor, restartPolicy=backoffPolicy(initialDelay=0.1, maxDelay=1, factor=2)
        )
        await proxy.start()
        await proxy.enable("ollama")
        moved = freePort()
        await proxy.request("ollama:set-port", {"port": moved})
        await proxy.nodes("ollama", [directNode("B", engine)])
        pid = proxy.process.pid
        assert pid is not None
        exited = proxy.process.whenExited()
        os.kill(pid, signal.SIGKILL)
        await exited
        await proxy.process.whenRunning()
        await proxy.sync()
        response = await treq.post(
            f"http://127.0.0.1:{moved}/api/chat",
            json={"model": "m1", "stream": False, "messages": [{"role": "user", "content": "hi"}]},
            persistent=False,
        )
        await response.content()
        self.assertEqual(response.code, 200)
        self.assertEqual(len(proxy.crashes), 1)
        self.assertEqual(proxy.protocolErrors, [])
