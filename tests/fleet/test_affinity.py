"""Conversation affinity end to end: the real standalone process over two fake engines."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import FakeEngine, Status
from tests.support.conversations import turn
from tests.support.harness import reservedPort, startEngine
from tests.support.standaloneharness import StandaloneProxy, backendUp

CHAT = "/v1/chat/completions"


class AffinityTests(TestCase):
    """Later turns stay on their node, new conversations spread, a refusal moves one."""

    timeout = 120

    async def start(self, extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.a = startEngine(self, reactor, "openai", ["m1"], name="A")
        self.b = startEngine(self, reactor, "openai", ["m1"], name="B")
        self.opsPort = reservedPort(self)
        self.proxy = StandaloneProxy(
            self,
            reactor,
            ["llamacpp"],
            [("llamacpp", self.a.url), ("llamacpp", self.b.url)],
            ["--ops-port", str(self.opsPort), *extra],
            env,
        )
        await self.proxy.start()
        for engine in (self.a, self.b):
            await self.proxy.waitForLog(backendUp(engine.url))

    async def chat(self, messages: list[dict[str, str]]) -> tuple[str, int]:
        """One turn through the proxy: (serving node, attempts)."""
        response = await treq.post(
            self.proxy.url("llamacpp") + CHAT,
            json={"model": "m1", "messages": messages},
            persistent=False,
        )
        body = await response.json()
        self.assertEqual(response.code, 200, body)
        [nodeId] = response.headers.getRawHeaders("x-nvpair-node")
        [attempts] = response.headers.getRawHeaders("x-nvpair-attempts")
        return nodeId, int(attempts)

    def other(self, url: str) -> FakeEngine:
        return self.b if url == self.a.url else self.a

    def engine(self, url: str) -> FakeEngine:
        return self.a if url == self.a.url else self.b

    async def ops(self, path: str) -> bytes:
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}{path}", persistent=False)
        self.assertEqual(response.code, 200)
        body: bytes = await response.content()
        return body

    async def test_laterTurnsStay(self) -> None:
        """Interleaved conversations of four turns each, homed on both engines: every turn of
        a conversation is served where its first turn was; /metrics and /status count the
        hits.  The engines' ports are random, so which engine a new conversation lands on
        varies from run to run: first turns are sent until both engines are homes (at most
        32, each landing on either with even odds), then every conversation goes on."""
        await self.start()
        homes: dict[str, str] = {}
        for i in range(32):
            nodeId, attempts = await self.chat(turn(1, f"topic {i}"))
            self.assertEqual(attempts, 1)
            homes[f"topic {i}"] = nodeId
            if len(homes) >= 6 and set(homes.values()) == {self.a.url, self.b.url}:
                break
        self.assertEqual(set(homes.values()), {self.a.url, self.b.url})
        for n in range(2, 5):
            for topic, home in homes.items():
                nodeId, attempts = await self.chat(turn(n, topic))
                self.assertEqual((nodeId, attempts), (home, 1), (topic, n))
        k = len(homes)
        metrics = (await self.ops("/metrics")).decode()
        self.assertIn(
            f'nvpair_proxy_affinity_placements_total{{engine="llamacpp",result="hit"}} {3 * k}.0',
            metrics,
        )
        self.assertIn(
            f'nvpair_proxy_affinity_placements_total{{engine="llamacpp",result="miss"}} {k}.0',
            metrics,
        )
        status: Any = json.loads(await self.ops("/status"))
        self.assertEqual(status["affinity"]["mode"], "prefix")
        self.assertTrue(status["affinity"]["active"])
        self.assertEqual(
            status["affinity"]["counts"]["llamacpp"], {"hit": 3 * k, "miss": k, "overridden": 0}
        )
        self.assertEqual(status["affinity"]["entries"], 4 * k)

    async def test_conversationsSpread(self) -> None:
        """Twenty new conversations sent one at a time (so the fleet is always idle) land on
        both engines."""
        await self.start()
        served = {(await self.chat(turn(1, f"topic {i}")))[0] for i in range(20)}
        self.assertEqual(served, {self.a.url, self.b.url})

    async def test_offKeepsGivenOrder(self) -> None:
        """With ``--affinity off`` every idle request goes to the first backend given, and
        /status says affinity is not ordering."""
        await self.start(("--affinity", "off"))
        served = {(await self.chat(turn(1, f"topic {i}")))[0] for i in range(6)}
        self.assertEqual(served, {self.a.url})
        status: Any = json.loads(await self.ops("/status"))
        self.assertEqual(status["affinity"], {"mode": "off", "active": False})

    async def test_refusalMovesConversation(self) -> None:
        """A 503 from the home node fails the turn over to the other node, which becomes the
        home: the turns after go there directly."""
        await self.start()
        home, _ = await self.chat(turn(1, "kites"))
        self.assertEqual(await self.chat(turn(2, "kites")), (home, 1))
        self.engine(home).script(Status(503))
        moved = self.other(home).url
        self.assertEqual(await self.chat(turn(3, "kites")), (moved, 2))
        self.assertEqual(await self.chat(turn(4, "kites")), (moved, 1))
        self.assertEqual(await self.chat(turn(5, "kites")), (moved, 1))
        chats = [r for r in self.engine(home).requests if r.path == CHAT]
        self.assertEqual(len(chats), 3, "the old home saw turns 1-3 only")

    async def test_noPromptInLogs(self) -> None:
        """At debug level, nothing of the conversation reaches the log."""
        await self.start(("--log-level", "debug"))
        await self.chat(turn(2, "secretive-topic"))
        await self.chat(turn(3, "secretive-topic"))
        for record in self.proxy.logs:
            self.assertNotIn("secretive", json.dumps(record))
