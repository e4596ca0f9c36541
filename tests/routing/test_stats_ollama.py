"""Tests for nvpair.proxy.routing.stats on Ollama's native bodies (NDJSON, or one object)."""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase

from tests.support.statsbodies import measure, ndjsonBody


class OllamaTests(SynchronousTestCase):
    """Ollama-dialect bodies: NDJSON streams and single JSON documents."""

    def test_streamedDurations(self) -> None:
        """eval_count over eval_duration (ns) gives tokensPerSecond."""
        body = ndjsonBody(
            ["a", "b"],
            {
                "total_duration": 9,
                "prompt_eval_count": 26,
                "prompt_eval_duration": 1,
                "eval_count": 290,
                "eval_duration": 4_709_213_000,
            },
        )
        self.assertEqual(
            measure("ollama", body),
            {"promptTokens": 26, "completionTokens": 290, "tokensPerSecond": 61.58, "ttftMs": 500},
        )

    def test_streamedWithoutDuration(self) -> None:
        """Without eval_duration a streamed body's throughput comes from the clock."""
        body = ndjsonBody(["a", "b"], {"eval_count": 10})
        self.assertEqual(
            measure("ollama", body), {"completionTokens": 10, "tokensPerSecond": 5.0, "ttftMs": 500}
        )

    def test_nonStreamedGenerate(self) -> None:
        """A single /api/generate JSON body with a large context array is read from the tail."""
        body = json.dumps(
            {
                "model": "m",
                "response": "hi",
                "done": True,
                "context": list(range(5000)),
                "total_duration": 1,
                "prompt_eval_count": 3,
                "eval_count": 50,
                "eval_duration": 1_000_000_000,
            }
        ).encode()
        self.assertEqual(
            measure("ollama", body, [777] * 40),
            {"promptTokens": 3, "completionTokens": 50, "tokensPerSecond": 50.0, "ttftMs": 500},
        )

    def test_longDoneLineLargerThanTail(self) -> None:
        """A streamed done line longer than the tail still yields its counts."""
        body = ndjsonBody(
            ["a", "b"],
            {
                "context": list(range(5000)),
                "prompt_eval_count": 2,
                "eval_count": 8,
                "eval_duration": 2_000_000_000,
            },
        )
        self.assertEqual(
            measure("ollama", body, tailBytes=1024),
            {"promptTokens": 2, "completionTokens": 8, "tokensPerSecond": 4.0, "ttftMs": 500},
        )

    def test_prettyPrintedSingle(self) -> None:
        """A pretty-printed single Ollama body is read as one object."""
        body = json.dumps(
            {
                "model": "m",
                "done": True,
                "prompt_eval_count": 4,
                "eval_count": 6,
                "eval_duration": 3_000_000_000,
            },
            indent=2,
        ).encode()
        self.assertEqual(
            measure("ollama", body),
            {"promptTokens": 4, "completionTokens": 6, "tokensPerSecond": 2.0, "ttftMs": 500},
        )

    def test_fieldsFromLastObjectOnly(self) -> None:
        """Fields are read from the last reporting object, never mixed with an earlier line."""
        body = ndjsonBody(
            ["a"], {"prompt_eval_count": 1, "eval_count": 1, "eval_duration": 1}
        ) + ndjsonBody([], {"eval_count": 4})
        self.assertEqual(
            measure("ollama", body), {"completionTokens": 4, "tokensPerSecond": 2.0, "ttftMs": 500}
        )

    def test_embedPromptOnly(self) -> None:
        """/api/embed reports prompt_eval_count only, giving promptTokens only."""
        body = json.dumps(
            {"model": "m", "embeddings": [[0.5] * 8], "total_duration": 5, "prompt_eval_count": 6}
        ).encode()
        self.assertEqual(measure("ollama", body), {"promptTokens": 6, "ttftMs": 500})

    def test_noUsageEstimated(self) -> None:
        """Without counts, content lines are counted, excluding the done line."""
        body = ndjsonBody(["a", "b", "c"], {"done_reason": "stop"})
        self.assertEqual(
            measure("ollama", body),
            {"completionTokens": 3, "tokensPerSecond": 1.5, "ttftMs": 500, "estimated": True},
        )

    def test_noUsageNoDoneLine(self) -> None:
        """A cut-off stream without a done line counts every line, last one unterminated."""
        body = ndjsonBody(["a", "b", "c"], None).rstrip(b"\n")
        result = measure("ollama", body, [1] * len(body))
        assert result is not None
        self.assertEqual(result["completionTokens"], 3)

    def test_escapedKeyInContentIgnored(self) -> None:
        """A quoted "eval_count" inside content is not taken as the report."""
        body = ndjsonBody(['"eval_count": 999', "b"], {"done_reason": "stop"})
        result = measure("ollama", body)
        assert result is not None
        self.assertEqual((result["completionTokens"], result["estimated"]), (2, True))

    def test_prettySingleWithoutCounts(self) -> None:
        """A pretty-printed single body without counts is one event: no estimate."""
        body = json.dumps({"embedding": [0.1, 0.2]}, indent=2).encode()
        self.assertEqual(measure("ollama", body), {"ttftMs": 500})
