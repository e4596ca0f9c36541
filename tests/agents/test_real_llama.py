"""The agents' routes on the real llama-server (Gemma 3 270M), directly and through the real
standalone proxy with the official ``anthropic`` client.  Runs where
``tests/support/llamaserver.py`` finds a llama-server (``NVPAIR_LLAMA_SERVER_BIN`` and
``NVPAIR_LLAMA_MODEL``, else the checkout's ``.venv-llama-server``); skipped, saying why,
otherwise."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import treq
from twisted.internet import task
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from nvpair.proxy.engines import LLAMACPP
from tests.agents.agentkit import SECRET, reactor
from tests.simengine.helpers import sentence
from tests.support.harness import reservedPort
from tests.support.llamaserver import LlamaServer, startLlamaServer
from tests.support.standaloneharness import StandaloneProxy, backendUp

MODEL = "gemma3-270m"
DEADLINE = 120.0
BODIES: dict[bytes, dict[str, Any]] = {
    b"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    b"/v1/completions": {"prompt": "hi"},
    b"/v1/embeddings": {"input": "hi"},
    b"/v1/rerank": {"query": "hi", "documents": ["a"]},
    b"/v1/messages": {"messages": [{"role": "user", "content": "hi"}]},
    b"/v1/responses": {"input": "hi"},
    b"/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
    b"/v1/responses/input_tokens": {"input": "hi"},
}


class RealLlamaAgentsTests(TestCase):
    """llama-server (one slot) and the standalone proxy in front of it."""

    timeout = 900

    async def start(self) -> None:
        self.server: LlamaServer = await startLlamaServer(
            self, reactor, "-np", "1", "--ctx-size", "4096", "-a", MODEL
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
        response = await treq.get(
            f"http://127.0.0.1:{self.opsPort}{path}", persistent=False, timeout=30
        )
        body = bytes(await treq.content(response))
        self.assertEqual(response.code, 200, body[:300])
        return body

    async def test_routesTheServerAnswers(self) -> None:
        """Every inference and model-routed route of the engine table is one llama-server
        serves (anything but 404 on POST), and a route it lacks is 404."""
        await self.start()
        for path in sorted(LLAMACPP.inferenceRoutes | LLAMACPP.modelRoutes):
            response = await treq.post(
                self.server.url + path.decode(),
                json={"model": MODEL, "max_tokens": 1, **BODIES[path]},
                persistent=False,
                timeout=DEADLINE,
            )
            await treq.content(response)
            self.assertNotEqual(response.code, 404, path)
        response = await treq.post(self.server.url + "/v1/nothing", json={}, persistent=False)
        await treq.content(response)
        self.assertEqual(response.code, 404)

    async def test_messagesRoundTrip(self) -> None:
        """The same long-prompted Messages request twice through the proxy: the second finds
        most of the prompt cached; /status and /metrics count exactly what the server
        reported (prompt = input + cache read); count_tokens is the server's own count."""
        await self.start()
        client = anthropic.Anthropic(
            base_url=self.proxy.url("llamacpp"), api_key=SECRET, max_retries=0, timeout=DEADLINE
        )
        self.addCleanup(client.close)
        system = sentence(300)
        ask: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 4,
            "system": system,
            "messages": [{"role": "user", "content": "hi"}],
        }

        def run() -> tuple[Any, Any, Any]:
            first = client.messages.create(**ask)
            with client.messages.stream(**ask) as stream:
                second = stream.get_final_message()
            counted = client.messages.count_tokens(
                model=MODEL, system=system, messages=ask["messages"]
            )
            return first, second, counted

        first, second, counted = await deferToThread(run)
        usages = [first.usage, second.usage]
        prompts = [u.input_tokens + (u.cache_read_input_tokens or 0) for u in usages]
        cached = [u.cache_read_input_tokens or 0 for u in usages]
        self.assertGreater(cached[1], prompts[1] // 2)
        self.assertEqual(counted.input_tokens, prompts[0])
        self.assertLessEqual(second.usage.output_tokens, 4)
        deadline = reactor.seconds() + DEADLINE
        while True:
            status: dict[str, Any] = json.loads(await self.ops("/status"))
            ended = [w for w in status["workloads"]["recent"] if w["completedAt"] is not None]
            if len(ended) == 2 or reactor.seconds() > deadline:
                break
            await task.deferLater(reactor, 0.05, lambda: None)
        stats = [w["stats"] for w in reversed(ended)]
        self.assertEqual([s["promptTokens"] for s in stats], prompts)
        self.assertEqual([s.get("cachedTokens", 0) for s in stats], cached)
        metrics = (await self.ops("/metrics")).decode()
        node = f'{{node="{self.server.url}"}}'
        self.assertIn(
            f"nvpair_proxy_engine_prompt_tokens_total{node} {float(sum(prompts))}", metrics
        )
        self.assertIn(
            f"nvpair_proxy_engine_cached_prompt_tokens_total{node} {float(sum(cached))}", metrics
        )
        self.assertNotIn(system[-30:], json.dumps(self.proxy.logs))
