"""Cached prompt tokens read from the response tail (``StatsMeter``), as engines report them."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.stats import StatsMeter


def measure(body: bytes, dialect: str = "openai") -> dict[str, object] | None:
    meter = StatsMeter(dialect, 0.0)
    meter.firstByte(0.1)
    meter.feed(body)
    return meter.result(0.2)


def sse(*events: object) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    )


class CachedTokenTests(SynchronousTestCase):
    """OpenAI ``cached_tokens``, llama.cpp ``timings.cache_n``; none for Ollama."""

    def test_openaiDetails(self) -> None:
        """``usage.prompt_tokens_details.cached_tokens`` of a whole body or a stream."""
        usage = {
            "prompt_tokens": 1132,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 1116},
        }
        whole = json.dumps({"choices": [], "usage": usage}).encode()
        self.assertEqual(
            measure(whole),
            {"promptTokens": 1132, "completionTokens": 5, "cachedTokens": 1116, "ttftMs": 100},
        )
        streamed = measure(sse({"choices": [{"delta": {"content": "a"}}]}, {"usage": usage}))
        assert streamed is not None
        self.assertEqual(streamed["cachedTokens"], 1116)

    def test_llamacppTimings(self) -> None:
        """Without cached_tokens in usage, llama.cpp's ``timings.cache_n`` counts."""
        body = sse(
            {"choices": [{"delta": {"content": "a"}}]},
            {
                "usage": {"prompt_tokens": 300, "completion_tokens": 2},
                "timings": {"cache_n": 256, "prompt_n": 44, "prompt_ms": 3.1},
            },
        )
        stats = measure(body)
        assert stats is not None
        self.assertEqual((stats["cachedTokens"], stats["promptMs"]), (256, 3.1))

    def test_promptTimeOnlyWhenSound(self) -> None:
        """``timings.prompt_ms`` is kept only as a finite, non-negative number."""
        for value in (-1, "3.1", True, None, 1e300, [1]):
            body = json.dumps(
                {
                    "usage": {"prompt_tokens": 300, "completion_tokens": 2},
                    "timings": {"cache_n": 256, "prompt_ms": value},
                }
            ).encode()
            stats = measure(body)
            assert stats is not None
            self.assertNotIn("promptMs", stats, value)

    def test_absentOrNonsense(self) -> None:
        """No count (Ollama, LM Studio), a wrong type or more than the prompt: absent."""
        ollama = b'{"done":true,"prompt_eval_count":10,"eval_count":3}\n'
        self.assertNotIn("cachedTokens", measure(ollama, "ollama") or {})
        for details in ({"cached_tokens": "9"}, {"cached_tokens": 11}, {"cached_tokens": -1}):
            usage = {"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": details}
            self.assertNotIn("cachedTokens", measure(json.dumps({"usage": usage}).encode()) or {})

    @given(st.binary(max_size=200), st.integers(), st.integers())
    def test_garbage(self, noise: bytes, prompt: int, cached: int) -> None:
        """Whatever surrounds it, a cached count is an int between 0 and the prompt count."""
        doc = {
            "usage": {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}},
            "timings": {"cache_n": cached},
        }
        stats = measure(noise + json.dumps(doc).encode()) or {}
        if "cachedTokens" in stats:
            value = stats["cachedTokens"]
            assert type(value) is int
            self.assertTrue(0 <= value <= prompt)
