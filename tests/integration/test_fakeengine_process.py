"""The kit's fake engine with the official openai and ollama clients, and as a process."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet.threads import deferToThread

from nvpair.proxy.testing.fakeengine import Answer, engineFromArgs
from tests.support.cases.enginecase import EngineTestCase, reactor
from tests.support.kitprocess import spawnKitEngine


class OfficialClientTests(EngineTestCase):
    """The official openai and ollama clients accept the fake's answers."""

    async def test_openaiClient(self) -> None:
        """openai: chat non-streaming and streaming with usage."""
        import openai

        url = self.engine.url + "/v1"

        def run() -> tuple[Any, list[Any]]:
            with openai.OpenAI(base_url=url, api_key="x", max_retries=0) as client:
                plain = client.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": "hi"}]
                )
                chunks = list(
                    client.chat.completions.create(
                        model="m2",
                        messages=[{"role": "user", "content": "hi"}],
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
            return plain, chunks

        plain, chunks = await deferToThread(run)
        self.assertEqual(plain.choices[0].message.content, "tok0tok1tok2")
        self.assertEqual(plain.usage.total_tokens, 10)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, "tok0tok1tok2")
        self.assertEqual(chunks[-1].usage.completion_tokens, 3)
        self.assertEqual(chunks[0].model, "m2")

    async def test_ollamaClient(self) -> None:
        """ollama: chat streaming and not, generate, embed and list."""
        import ollama

        engine = self.makeEngine("ollama")

        def run() -> tuple[Any, ...]:
            with ollama.Client(host=engine.url) as client:
                msgs = [{"role": "user", "content": "hi"}]
                plain = client.chat(model="m1", messages=msgs)
                streamed = list(client.chat(model="m1", messages=msgs, stream=True))
                gen = client.generate(model="m1", prompt="x")
                emb = client.embed(model="m1", input=["a", "b"])
                listed = client.list()
            return plain, streamed, gen, emb, listed

        plain, streamed, gen, emb, listed = await deferToThread(run)
        self.assertEqual(plain.message.content, "tok0tok1tok2")
        self.assertEqual(plain.eval_count, 3)
        self.assertEqual("".join(p.message.content for p in streamed), "tok0tok1tok2")
        self.assertTrue(streamed[-1].done)
        self.assertEqual(gen.response, "tok0tok1tok2")
        self.assertEqual(len(emb.embeddings), 2)
        self.assertEqual([m.model for m in listed.models], ["m1", "m2"])


class CLITests(EngineTestCase):
    """The standalone entry point."""

    def test_engineFromArgs(self) -> None:
        """engineFromArgs listens with the given dialect, models and default answer."""
        engine = engineFromArgs(
            reactor,
            ["--dialect", "ollama", "--models", "a,b", "--chunks", "50", "--chunk-delay", "0.01"],
        )
        self.addCleanup(engine.close)
        self.assertEqual((engine.dialect, engine.models), ("ollama", ["a", "b"]))
        self.assertEqual(engine.default, Answer(chunks=50, chunkDelay=0.01))
        self.assertFalse(engine.record)
        self.assertGreater(engine.port, 0)

    async def test_processPrintsPort(self) -> None:
        """python -m nvpair.proxy.testing.fakeengine prints {"port": N} and serves on it."""
        ready = await spawnKitEngine(
            self, reactor, "nvpair.proxy.testing.fakeengine", "--models", "x"
        )
        port = ready["port"]
        response = await self.http.get(f"http://127.0.0.1:{port}/v1/models")
        doc = json.loads(await treq.content(response))
        self.assertEqual(doc["data"][0]["id"], "x")
