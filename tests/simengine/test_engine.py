"""The simulated engine in memory: timing, cache hits, usage per dialect, FIFO, disconnects."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.testing.fakeengine import IRequestHandler
from nvpair.proxy.testing.simengine.core import IRun
from nvpair.proxy.testing.simengine.run import Run
from tests.simengine.helpers import Answer, Harness, chat, get, post, sentence

SYSTEM = sentence(100)  # 100 words: with the role marker, 101 tokens before the user turn


class TimingAndCacheTests(SynchronousTestCase):
    """Prefill costs per uncached token; a shared prefix is served from the cache."""

    def setUp(self) -> None:
        self.h = Harness(prefillMs=10.0, decodeMs=5.0, blockSize=16)

    def test_interfaces(self) -> None:
        """The engine answers its connections; a run can be cancelled."""
        self.assertTrue(verifyObject(IRequestHandler, self.h.engine))
        self.assertTrue(IRun.implementedBy(Run))

    def test_firstTokenAfterPrefill(self) -> None:
        """A stream's first content token comes after prefill plus one decode step."""
        _, transport = self.h.send(post(b"/v1/chat/completions", chat(SYSTEM, "hi", stream=True)))
        # 101 + 2 (user marker, hi) + 1 (generation marker) = 104 tokens: 1.04 s of prefill
        self.h.clock.advance(1.03)
        self.assertEqual(transport.value(), b"")
        self.h.clock.advance(0.02)
        self.assertIn(b'"role":"assistant"', transport.value())
        self.assertNotIn(b"tok0", transport.value())
        self.h.clock.advance(0.005)
        self.assertIn(b'"content":"tok0"', transport.value())

    def test_sharedSystemPromptHits(self) -> None:
        """A second user with the same system prompt gets its leading blocks from the cache."""
        first = self.h.exchange(post(b"/v1/chat/completions", chat(SYSTEM, "hi", max_tokens=2)))
        self.assertEqual(first.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        second = self.h.exchange(post(b"/v1/chat/completions", chat(SYSTEM, "other user")))
        usage, timings = second.json()["usage"], second.json()["timings"]
        self.assertEqual(usage["prompt_tokens"], 105)
        self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"], 96)  # 6 full blocks
        self.assertEqual((timings["cache_n"], timings["prompt_n"]), (96, 9))
        self.assertEqual(timings["prompt_ms"], 90.0)
        stats = self.h.engine.stats
        self.assertEqual((stats.promptTokens, stats.cachedTokens), (104 + 105, 96))

    def test_nextTurnHitsAnswer(self) -> None:
        """The next turn finds the previous prompt and answer cached."""
        one = self.h.exchange(post(b"/v1/chat/completions", chat(SYSTEM, "hi", max_tokens=30)))
        answer = one.json()["choices"][0]["message"]["content"]
        two = self.h.exchange(post(b"/v1/chat/completions", chat(SYSTEM, "hi", answer, "more")))
        # turn one: 104 prompt + 30 answer = 134 tokens = 8 full blocks
        self.assertEqual(two.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 128)

    def test_repeatLeavesOneToken(self) -> None:
        """A prompt entirely cached still evaluates its last token (as llama-server does)."""
        doc = {"model": "m", "prompt": sentence(32), "max_tokens": 1}
        self.h.exchange(post(b"/v1/completions", doc))
        again = self.h.exchange(post(b"/v1/completions", doc)).json()
        self.assertEqual((again["timings"]["cache_n"], again["timings"]["prompt_n"]), (31, 1))

    def test_evictionLosesHits(self) -> None:
        """With room for few blocks, other tenants' prompts evict the first one's (its tail
        first: after one other tenant its head still hits, after two nothing does)."""
        h = Harness(prefillMs=1.0, decodeMs=1.0, blockSize=16, cacheTokens=160)
        h.exchange(post(b"/v1/chat/completions", chat(SYSTEM, "hi", max_tokens=1)))
        h.exchange(post(b"/v1/chat/completions", chat(sentence(100, "x"), "hi", max_tokens=1)))
        head = h.exchange(post(b"/v1/chat/completions", chat(SYSTEM, "yo", max_tokens=1)))
        self.assertEqual(head.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 64)
        h.exchange(post(b"/v1/chat/completions", chat(sentence(100, "x"), "hi", max_tokens=1)))
        h.exchange(post(b"/v1/chat/completions", chat(sentence(100, "y"), "hi", max_tokens=1)))
        again = h.exchange(post(b"/v1/chat/completions", chat(SYSTEM, "hi", max_tokens=1)))
        self.assertEqual(again.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertLessEqual(len(h.engine.cache), 10)
        self.assertGreater(h.engine.cache.evictions, 0)


class DialectUsageTests(SynchronousTestCase):
    """Each dialect reports usage (and cached tokens) as its real engine does."""

    def twice(self, h: Harness, path: bytes, doc: dict[str, object]) -> Answer:
        """Send ``doc`` twice; the second answer."""
        h.exchange(post(path, {**doc, "stream": False}))
        return h.exchange(post(path, doc))

    def test_llamacppStreamTimingsAlways(self) -> None:
        """llama.cpp's last chunk always carries timings (cache_n); usage only when asked, in a
        last chunk with no choices."""
        h = Harness(decodeMs=1.0)
        events = self.twice(h, b"/v1/chat/completions", chat(SYSTEM, "x", stream=True)).events()
        last = events[-1]
        self.assertEqual(last["choices"][0]["finish_reason"], "stop")
        self.assertEqual((last["timings"]["cache_n"], last["timings"]["prompt_n"]), (96, 8))
        self.assertNotIn("usage", last)
        self.assertEqual(
            "".join(e["choices"][0]["delta"].get("content") or "" for e in events),
            " ".join(f"tok{i}" for i in range(16)),
        )
        asked = chat(SYSTEM, "x", stream=True, stream_options={"include_usage": True})
        tail = h.exchange(post(b"/v1/chat/completions", asked)).events()[-1]
        self.assertEqual(tail["choices"], [])
        self.assertEqual(tail["usage"]["prompt_tokens_details"]["cached_tokens"], 96)
        self.assertEqual(tail["timings"]["cache_n"], 96)

    def test_llamacppCompletionStreamUsage(self) -> None:
        """llama.cpp's streamed completion ends with usage and timings, unasked."""
        h = Harness(decodeMs=1.0)
        doc = {"prompt": sentence(40), "stream": True, "max_tokens": 2}
        last = self.twice(h, b"/v1/completions", doc).events()[-1]
        self.assertEqual(last["usage"]["prompt_tokens_details"]["cached_tokens"], 32)
        self.assertEqual(last["timings"]["cache_n"], 32)

    def test_lmstudioUsageOnlyWhenAsked(self) -> None:
        """LM Studio streams usage only with include_usage, with empty choices, no cached count."""
        h = Harness(dialect="lmstudio", decodeMs=1.0)
        plain = self.twice(h, b"/v1/chat/completions", chat(SYSTEM, "x", stream=True)).events()
        self.assertNotIn("usage", plain[-1])
        asked = chat(SYSTEM, "x", stream=True, stream_options={"include_usage": True})
        events = self.twice(h, b"/api/v0/chat/completions", asked).events()
        self.assertEqual(events[-1]["choices"], [])
        self.assertEqual(events[-1]["usage"]["prompt_tokens"], 104)
        self.assertNotIn("prompt_tokens_details", events[-1]["usage"])
        doc = h.exchange(post(b"/v1/completions", {"model": "m", "prompt": "a b"})).json()
        self.assertEqual(doc["usage"]["prompt_tokens"], 2)
        self.assertNotIn("timings", doc)

    def test_ollamaNative(self) -> None:
        """Ollama streams NDJSON by default and ends with prompt_eval_count, no cached count."""
        h = Harness(dialect="ollama", models=("llama3:latest",), decodeMs=1.0)
        doc = {**chat(SYSTEM, "x"), "model": "llama3", "options": {"num_predict": 3}}
        answer = self.twice(h, b"/api/chat", doc)
        self.assertEqual(answer.headers[b"content-type"], b"application/x-ndjson")
        lines = answer.events()
        self.assertEqual(len(lines), 4)
        self.assertTrue(lines[-1]["done"])
        self.assertEqual((lines[-1]["prompt_eval_count"], lines[-1]["eval_count"]), (104, 3))
        self.assertNotIn("cached", answer.body.decode())
        self.assertEqual(h.engine.stats.cachedTokens, 96)
        gen = h.exchange(
            post(b"/api/generate", {"model": "llama3", "prompt": "a", "stream": False})
        )
        self.assertEqual(gen.json()["response"], " ".join(f"tok{i}" for i in range(16)))

    def test_ollamaOpenAIRoute(self) -> None:
        """Ollama's OpenAI route reports plain usage."""
        h = Harness(dialect="ollama", models=("llama3:latest",), decodeMs=1.0)
        doc = h.exchange(
            post(b"/v1/chat/completions", {**chat("s", "x"), "model": "llama3"})
        ).json()
        self.assertEqual(set(doc["usage"]), {"prompt_tokens", "completion_tokens", "total_tokens"})


class SlotTests(SynchronousTestCase):
    """Slots and the FIFO seen through the engine's routes."""

    def setUp(self) -> None:
        self.h = Harness(slots=1, queueMax=1, prefillMs=0.0, decodeMs=100.0, outputTokens=10)

    def test_queuedWaitsAndIsReported(self) -> None:
        """With one slot the second request waits; /slots and /metrics show it; the third is
        refused with 503."""
        _, first = self.h.send(post(b"/v1/completions", {"prompt": "a"}))
        _, second = self.h.send(post(b"/v1/completions", {"prompt": "b"}))
        refused = self.h.exchange(post(b"/v1/completions", {"prompt": "c"}))
        self.assertEqual(refused.status, 503)
        slots = self.h.exchange(get(b"/slots")).json()
        self.assertEqual(
            [(s["id"], s["is_processing"], s["id_task"]) for s in slots], [(0, True, 1)]
        )
        self.assertEqual(self.h.exchange(get(b"/slots?fail_on_no_slot=1")).status, 503)
        metrics = self.h.exchange(get(b"/metrics")).body.decode()
        self.assertIn("llamacpp:requests_processing 1\n", metrics)
        self.assertIn("llamacpp:requests_deferred 1\n", metrics)
        self.h.runUntil(lambda: b"tok9" in second.value(), 3.0)
        self.assertLessEqual(abs(self.h.clock.seconds() - 2.0), 0.01)
        self.assertIn(b"tok9", first.value())
        stats = self.h.exchange(get(b"/sim/stats")).json()
        self.assertEqual((stats["completed"], stats["refused"]), (2, 1))
        self.assertLessEqual(abs(stats["queue"]["wait_ms_max"] - 1000.0), 1)
        # Each answer says how long it waited in the FIFO: none, then one service time.
        waits = [Answer(t.value()).headers[b"x-sim-queue-ms"] for t in (first, second)]
        self.assertEqual(waits, [b"0.0", b"1000.0"])

    def test_disconnectFreesSlotAndQueue(self) -> None:
        """A client leaving frees its slot; a queued one leaving never runs."""
        one, _ = self.h.send(post(b"/v1/completions", {"prompt": "a"}))
        two, _ = self.h.send(post(b"/v1/completions", {"prompt": "b"}))
        two.connectionLost()
        self.assertEqual(self.h.engine.slots.queued, 0)
        one.connectionLost()
        self.assertEqual(self.h.engine.slots.busy, 0)
        self.assertEqual(self.h.engine.stats.cancelled, 2)
        self.assertEqual(self.h.clock.getDelayedCalls(), [])
        answer = self.h.exchange(post(b"/v1/completions", {"prompt": "c"}))
        self.assertEqual(answer.status, 200)
        self.assertEqual(self.h.engine.stats.promptTokens, 2)  # a and c ran, b never did

    def test_holdTakesSlots(self) -> None:
        """/sim/hold makes slots busy as direct clients would; 0 gives them back."""
        self.assertEqual(self.h.exchange(post(b"/sim/hold", {"slots": 1})).status, 200)
        self.assertTrue(self.h.exchange(get(b"/slots")).json()[0]["is_processing"])
        _, waiting = self.h.send(post(b"/v1/completions", {"prompt": "a"}))
        self.h.clock.advance(5)
        self.assertEqual(waiting.value(), b"")
        self.h.exchange(post(b"/sim/hold", {"slots": 0}))
        self.h.runUntil(
            lambda: waiting.value().endswith(b"0\r\n\r\n") or b"tok9" in waiting.value(), 2.0
        )
        self.assertEqual(self.h.exchange(post(b"/sim/hold", {"slots": -1})).status, 400)
