"""Streams that stall after commit, end to end: the real standalone process, a fake engine."""

from __future__ import annotations

import time
from typing import Any

import treq
from twisted.internet import reactor
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from twisted.web.client import ResponseFailed

from nvpair.proxy.testing.fakeengine import Answer, FakeEngine
from tests.support.harness import reservedPort, startEngine
from tests.support.standaloneharness import StandaloneProxy

CHAT = "/v1/chat/completions"
REQUEST = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "go on"}]}


class StallTests(TestCase):
    """A silent engine is cut after ``--stream-idle-timeout``; a slow live one is kept."""

    timeout = 90

    async def start(self, idle: str) -> FakeEngine:
        engine = startEngine(self, reactor, "openai", ["m1"], name="A")
        self.opsPort = reservedPort(self)
        self.proxy = StandaloneProxy(
            self,
            reactor,
            ["llamacpp"],
            [("llamacpp", engine.url)],
            ["--ops-port", str(self.opsPort), "--stream-idle-timeout", idle],
        )
        await self.proxy.start()
        await self.proxy.waitForLog(
            lambda r: r.get("event") == "backend-up" and r["url"] == engine.url
        )
        return engine

    async def stream(self) -> tuple[Any, list[bytes], list[float], Failure | None]:
        """POST a streamed chat: (response, chunks, arrival times then the end's time, how
        the body ended: None when cleanly)."""
        response = await treq.post(
            self.proxy.url("llamacpp") + CHAT, json=REQUEST, persistent=False
        )
        chunks: list[bytes] = []
        times: list[float] = []

        def got(data: bytes) -> None:
            chunks.append(data)
            times.append(time.monotonic())

        ending: Failure | None = None
        try:
            await treq.collect(response, got)
        except ResponseFailed:
            ending = Failure()
        times.append(time.monotonic())  # when the body ended
        return response, chunks, times, ending

    async def test_stalledStreamIsCut(self) -> None:
        """The engine sends one chunk and then nothing for a minute: after about a second
        the client's stream ends cut short (no clean end), the engine connection is closed,
        ``stream-stalled`` is logged (warn, workload, node, seconds idle) and counted."""
        engine = await self.start("1s")
        engine.script(Answer(chunks=3, chunkDelay=60.0))
        began = time.monotonic()
        response, chunks, times, ending = await self.stream()
        self.assertEqual(response.code, 200)
        self.assertIsNotNone(ending, "the client can tell the stream was cut short")
        body = b"".join(chunks)
        self.assertIn(b"tok0", body)
        self.assertNotIn(b"tok1", body)
        # The proxy's own measure (logged, below) is exact; the client's only bounds it.
        self.assertGreaterEqual(times[-1] - times[-2], 0.5, "not cut before the timeout")
        self.assertLess(times[-1] - began, 30.0, "cut long before the engine resumed")
        record = await self.proxy.waitForLog(lambda r: r.get("event") == "stream-stalled")
        self.assertEqual(record["level"], "warn")
        self.assertEqual(record["node"], engine.url)
        self.assertEqual(record["engine"], "llamacpp")
        self.assertIsInstance(record["workload"], str)
        self.assertGreaterEqual(record["idle"], 1.0)
        self.assertNotIn("go on", str(record))
        chats = [r for r in engine.requests if r.path == CHAT]
        self.assertEqual(len(chats), 1, "nothing retried")
        await chats[0].connectionLost  # the engine connection was closed
        metrics = await (
            await treq.get(f"http://127.0.0.1:{self.opsPort}/metrics", persistent=False)
        ).text()
        self.assertIn('nvpair_proxy_streams_stalled_total{engine="llamacpp"} 1.0', metrics)

    async def test_slowStreamKept(self) -> None:
        """Chunks every 0.3 s for about three seconds with a 2 s idle timeout: the whole
        answer arrives and ends cleanly; nothing is logged as stalled."""
        engine = await self.start("2s")
        engine.script(Answer(chunks=10, chunkDelay=0.3))
        response, chunks, times, ending = await self.stream()
        self.assertEqual(response.code, 200)
        self.assertIsNone(ending)
        body = b"".join(chunks).decode()
        for i in range(10):
            self.assertIn(f'"content":"tok{i}"', body)
        self.assertIn("[DONE]", body)
        self.assertGreater(times[-1] - times[0], 2.0, "longer than the idle timeout in all")
        self.assertEqual(self.proxy.events("stream-stalled"), [])

    async def test_truncationLikeDeadEngine(self) -> None:
        """The cut stream's workload ends the way a broken-off stream does: one terminal."""
        engine = await self.start("1s")
        engine.script(Answer(chunks=3, chunkDelay=60.0))
        _, _, _, ending = await self.stream()
        self.assertIsNotNone(ending)
        await self.proxy.waitForLog(lambda r: r.get("event") == "stream-stalled")
        status = await (
            await treq.get(f"http://127.0.0.1:{self.opsPort}/status", persistent=False)
        ).json()
        self.assertEqual(status["requestsInProgress"], 0)
        self.assertEqual(sum(status["workloads"]["terminals"].values()), 1)
        self.assertEqual(status["workloads"]["live"], 0)
