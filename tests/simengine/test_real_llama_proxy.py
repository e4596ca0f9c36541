"""The real standalone proxy in front of the real llama-server (Gemma 3 270M), end to end.

The proxy process (``twistd -n nvpair-proxy --standalone``) has llama-server as its only
llama.cpp backend; everything is checked through the contract: the llama.cpp facade, the
operations listener's ``/status`` and ``/metrics``. Runs where ``tests/support/llamaserver.py``
finds a llama-server (``NVPAIR_LLAMA_SERVER_BIN`` and ``NVPAIR_LLAMA_MODEL``, else the
checkout's ``.venv-llama-server``); skipped, saying why, otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import treq
from twisted.internet import reactor as _reactor
from twisted.internet import task
from twisted.trial.unittest import TestCase

from tests.simengine.helpers import sentence
from tests.support.harness import reservedPort
from tests.support.llamaserver import LlamaServer, startLlamaServer
from tests.support.standaloneharness import StandaloneProxy, backendUp

reactor: Any = _reactor
MODEL = "gemma3-270m"
DEADLINE = 120.0  # generous: prompt evaluation takes seconds on a loaded 2-core machine


class RealLlamaProxyTests(TestCase):
    """The proxy reads llama-server's slots with its own probe and counts its cache hits."""

    timeout = 900

    async def start(self) -> None:
        """llama-server (2 slots, /slots, /metrics) and the standalone proxy in front of it."""
        self.server: LlamaServer = await startLlamaServer(
            self, reactor, "-np", "2", "--ctx-size", "8192", "--metrics", "--slots", "-a", MODEL
        )
        self.opsPort = reservedPort(self)
        self.proxy = StandaloneProxy(
            self,
            reactor,
            ["llamacpp"],
            [("llamacpp", self.server.url)],
            ["--ops-port", str(self.opsPort)],
        )
        await self.proxy.start()
        await self.proxy.waitForLog(backendUp(self.server.url), DEADLINE)

    async def ops(self, path: str) -> bytes:
        """A GET on the operations listener; the body of its 200 answer."""
        response = await treq.get(
            f"http://127.0.0.1:{self.opsPort}{path}", persistent=False, timeout=30
        )
        body = bytes(await treq.content(response))
        self.assertEqual(response.code, 200, body[:500])
        return body

    async def engineState(self, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """``/status``'s engine state of the server once ``done`` holds for it (polled, bounded)."""
        deadline = reactor.seconds() + DEADLINE
        entry: dict[str, Any] = {}
        while reactor.seconds() < deadline:
            if self.server.ended.called:
                self.fail("llama-server ended:\n" + self.server.lastLines())
            status: dict[str, Any] = await treq.json_content(
                await treq.get(
                    f"http://127.0.0.1:{self.opsPort}/status", persistent=False, timeout=30
                )
            )
            entry = status.get("engineStates", {}).get(self.server.url, {})
            if done(entry):
                self.status = status
                return entry
            await task.deferLater(reactor, 0.2, lambda: None)
        self.fail(f"the engine state never matched: {entry}")

    async def chat(self, system: str) -> dict[str, Any]:
        """One chat through the proxy's llama.cpp facade; its 200 answer, served by the server."""
        response = await treq.post(
            self.proxy.url("llamacpp") + "/v1/chat/completions",
            json={
                "model": MODEL,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "hi"},
                ],
            },
            persistent=False,
            timeout=DEADLINE,
        )
        body: dict[str, Any] = await treq.json_content(response)
        self.assertEqual(response.code, 200, body)
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-node"), [self.server.url])
        return body

    async def test_slotsReadByTheProxy(self) -> None:
        """/status shows the server's 2 slots, idle, read fresh by the proxy's /slots probe;
        /metrics has them too."""
        await self.start()
        entry = await self.engineState(
            lambda e: e.get("state") == "fresh" and e.get("slotsTotal") == 2
        )
        self.assertEqual(
            (entry["probe"], entry["slotsBusy"], entry["slotsAvailable"]), ("/slots", 0, 2)
        )
        self.assertNotIn("problem", entry)
        [node] = self.status["facades"]["llamacpp"]["nodes"]
        self.assertEqual((node["id"], node["engine"]["slotsTotal"]), (self.server.url, 2))
        metrics = (await self.ops("/metrics")).decode()
        self.assertIn(f'nvpair_proxy_engine_slots_total{{node="{self.server.url}"}} 2.0', metrics)
        self.assertIn(f'nvpair_proxy_engine_state_fresh{{node="{self.server.url}"}} 1.0', metrics)

    async def test_promptCacheMoves(self) -> None:
        """The proxy asks the server's ``/props`` once and knows its prompt cache moves
        saved prompts (``/status`` says so): placement keeps a tenant's new conversations
        apart on it (spec §11 "Placement")."""
        await self.start()
        entry = await self.engineState(lambda e: "promptCache" in e)
        self.assertEqual(entry["promptCache"], "moves")

    async def test_cacheHitsCounted(self) -> None:
        """The same long prompt twice: the second answer reports most of it cached, and the
        proxy's /status and /metrics count exactly what the server reported."""
        await self.start()
        system = sentence(600)
        first = await self.chat(system)
        second = await self.chat(system)
        usage, timings = second["usage"], second["timings"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        self.assertGreaterEqual(usage["prompt_tokens"], 600)
        self.assertGreater(cached, usage["prompt_tokens"] // 2)
        self.assertEqual(cached, timings["cache_n"])
        self.assertEqual(usage["prompt_tokens"], timings["cache_n"] + timings["prompt_n"])
        prompt = first["usage"]["prompt_tokens"] + usage["prompt_tokens"]
        total = first["usage"]["prompt_tokens_details"]["cached_tokens"] + cached
        entry = await self.engineState(lambda e: e.get("promptTokens") == prompt)
        self.assertEqual(entry["cachedTokens"], total)
        self.assertEqual(entry["cacheHitRatio"], round(total / prompt, 4))
        self.assertGreater(entry["cacheHitRatio"], 0.25)
        metrics = (await self.ops("/metrics")).decode()
        node = re.escape(f'{{node="{self.server.url}"}}')
        for name, value in (
            ("nvpair_proxy_engine_prompt_tokens_total", prompt),
            ("nvpair_proxy_engine_cached_prompt_tokens_total", total),
            ("nvpair_proxy_engine_cache_hit_ratio", total / prompt),
        ):
            found = re.search(rf"^{name}{node} (\S+)$", metrics, re.MULTILINE)
            assert found is not None, f"{name} missing for the node"
            self.assertAlmostEqual(float(found.group(1)), value, places=6)
        # The prompt went through the proxy and never into its log.
        self.assertNotIn(system[-30:], json.dumps(self.proxy.logs))
