"""Tests for nvpair.proxy.routing.stats: per-request statistics from a streamed body."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.stats import StatsMeter
from tests.support.statsbodies import USAGE, measure, ndjsonBody, sseBody


class OpenAITests(SynchronousTestCase):
    """OpenAI-dialect bodies: SSE streams and single JSON documents."""

    def test_streamedUsage(self) -> None:
        """A streamed usage chunk before [DONE] gives exact counts and clock throughput."""
        result = measure("openai", sseBody(["a", "b", "c"], USAGE))
        self.assertEqual(
            result,
            {"promptTokens": 12, "completionTokens": 340, "tokensPerSecond": 170.0, "ttftMs": 500},
        )

    def test_lastUsageWins(self) -> None:
        """When several events carry usage, the last one is used; null usage is skipped."""
        body = (
            b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}\n\n'
            b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n'
            b"data: [DONE]\n\n"
        )
        result = measure("openai", body)
        assert result is not None
        self.assertEqual((result["promptTokens"], result["completionTokens"]), (5, 9))

    def test_escapedUsageInContentIgnored(self) -> None:
        """A quoted "usage" inside content text is not mistaken for the usage report."""
        body = sseBody(['{"usage": {"prompt_tokens": 77, "completion_tokens": 88}}', "y"])
        result = measure("openai", body)
        self.assertEqual(
            result,
            {"completionTokens": 2, "tokensPerSecond": 1.0, "ttftMs": 500, "estimated": True},
        )

    def test_nonStreamedUsage(self) -> None:
        """A single JSON completion body gives exact counts and no clock throughput."""
        body = json.dumps(
            {"id": "x", "choices": [{"message": {"content": "hi"}}], "usage": USAGE}
        ).encode()
        self.assertEqual(
            measure("openai", body), {"promptTokens": 12, "completionTokens": 340, "ttftMs": 500}
        )

    def test_prettyPrintedNonStreamed(self) -> None:
        """A pretty-printed JSON body with usage is still read."""
        body = json.dumps({"choices": [], "usage": USAGE}, indent=2).encode()
        result = measure("openai", body)
        assert result is not None
        self.assertEqual(result["completionTokens"], 340)

    def test_embeddingsUsage(self) -> None:
        """Embeddings usage (prompt_tokens and total_tokens only) gives promptTokens only."""
        body = json.dumps(
            {
                "object": "list",
                "data": [{"embedding": [0.1] * 10}],
                "usage": {"prompt_tokens": 8, "total_tokens": 8},
            }
        ).encode()
        self.assertEqual(measure("openai", body), {"promptTokens": 8, "ttftMs": 500})

    def test_responsesApiUsage(self) -> None:
        """The Responses API's input_tokens/output_tokens inside response.usage are read."""
        final = {
            "type": "response.completed",
            "response": {
                "id": "r",
                "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
            },
        }
        body = (
            b"event: response.output_text.delta\n"
            b'data: {"type":"response.output_text.delta","delta":"a"}\n\n'
            b"event: response.completed\ndata: " + json.dumps(final).encode() + b"\n\n"
        )
        result = measure("openai", body)
        assert result is not None
        self.assertEqual((result["promptTokens"], result["completionTokens"]), (3, 4))

    def test_largeNonStreamedTailStartsMidDocument(self) -> None:
        """A body far larger than the tail still yields the usage at its end."""
        body = json.dumps(
            {
                "data": [{"embedding": [0.123456] * 200_000}],
                "usage": {"prompt_tokens": 4, "total_tokens": 4},
            }
        ).encode()
        result = measure("openai", body, chunks=[4093] * (len(body) // 4093))
        self.assertEqual(result, {"promptTokens": 4, "ttftMs": 500})

    def test_noUsageEstimated(self) -> None:
        """Without usage, streamed content events are counted and flagged estimated."""
        result = measure("openai", sseBody(["a", "b", "c", "d"]))
        self.assertEqual(
            result,
            {"completionTokens": 4, "tokensPerSecond": 2.0, "ttftMs": 500, "estimated": True},
        )

    def test_noUsageWithoutDone(self) -> None:
        """Without a [DONE] trailer every data event counts as content."""
        result = measure("openai", sseBody(["a", "b", "c"], done=False))
        assert result is not None
        self.assertEqual(result["completionTokens"], 3)

    def test_doneWithoutSpace(self) -> None:
        """``data:[DONE]`` without a space is recognised as the trailer."""
        body = b'data:{"choices":[]}\n\ndata:{"choices":[]}\n\ndata:[DONE]\n\n'
        result = measure("openai", body)
        assert result is not None
        self.assertEqual(result["completionTokens"], 2)

    def test_crlfEvents(self) -> None:
        """CRLF-delimited SSE events are counted."""
        body = b'data: {"a":1}\r\n\r\ndata: {"a":2}\r\n\r\ndata: [DONE]\r\n\r\n'
        result = measure("openai", body, chunks=[1] * len(body))
        assert result is not None
        self.assertEqual(result["completionTokens"], 2)

    def test_singleJsonWithoutUsage(self) -> None:
        """A non-streamed body without usage yields no token counts, only ttft."""
        body = json.dumps({"choices": [{"message": {"content": "data: x\ndata: y"}}]}).encode()
        self.assertEqual(measure("openai", body), {"ttftMs": 500})

    def test_singleEventNotEstimated(self) -> None:
        """A stream of one event is too little to estimate from."""
        self.assertEqual(measure("openai", sseBody(["a"], done=False)), {"ttftMs": 500})

    @settings(max_examples=200, deadline=None)
    @given(st.data())
    def test_arbitraryChunking(self, data: st.DataObject) -> None:
        """Counts and estimates do not depend on how the body is cut into chunks."""
        withUsage = data.draw(st.booleans())
        body = sseBody(
            ["x" * n for n in range(data.draw(st.integers(2, 12)))], USAGE if withUsage else None
        )
        cuts = data.draw(st.lists(st.integers(1, 40), max_size=60))
        tailBytes = data.draw(st.sampled_from([512, 8192]))
        self.assertEqual(
            measure("openai", body, cuts, tailBytes=tailBytes),
            measure("openai", body, tailBytes=tailBytes),
        )


class SplitTests(SynchronousTestCase):
    """Usage reports cut at every byte offset."""

    def test_openaiSplitEveryOffset(self) -> None:
        """An SSE usage chunk split at any offset is still found."""
        body = sseBody(["a", "b"], USAGE)
        expected = measure("openai", body)
        for cut in range(1, len(body)):
            self.assertEqual(measure("openai", body, [cut]), expected, cut)
        assert expected is not None
        self.assertEqual(expected["completionTokens"], 340)

    def test_ollamaSplitEveryOffset(self) -> None:
        """An Ollama done line split at any offset is still found."""
        body = ndjsonBody(
            ["a", "b"], {"prompt_eval_count": 7, "eval_count": 20, "eval_duration": 500_000_000}
        )
        for cut in range(1, len(body)):
            for second in (1, 3):
                self.assertEqual(
                    measure("ollama", body, [cut, second]),
                    {
                        "promptTokens": 7,
                        "completionTokens": 20,
                        "tokensPerSecond": 40.0,
                        "ttftMs": 500,
                    },
                    cut,
                )


class MeterTests(SynchronousTestCase):
    """Behaviour common to both dialects."""

    def test_nothingMeasured(self) -> None:
        """With no first byte and no counts the result is None."""
        meter = StatsMeter("openai", 1.0)
        meter.feed(b'{"x": 1}')
        self.assertIsNone(meter.result(2.0))

    def test_countsWithoutFirstByte(self) -> None:
        """Counts are reported without ttft or clock throughput when no first byte was seen."""
        meter = StatsMeter("openai", 1.0)
        meter.feed(sseBody(["a"], USAGE))
        self.assertEqual(meter.result(2.0), {"promptTokens": 12, "completionTokens": 340})

    def test_firstByteFirstCallWins(self) -> None:
        """Only the first firstByte call sets the commit time; ttft rounds to ms."""
        meter = StatsMeter("ollama", 10.0)
        meter.firstByte(10.2345)
        meter.firstByte(11.0)
        self.assertEqual(meter.result(12.0), {"ttftMs": 235})

    def test_zeroStreamingTime(self) -> None:
        """No throughput is derived when the stream took no time."""
        result = measure("openai", sseBody(["a", "b"], USAGE), first=101.0, end=101.0)
        assert result is not None
        self.assertNotIn("tokensPerSecond", result)

    def test_unknownDialect(self) -> None:
        """An unknown dialect is refused."""
        self.assertRaises(ValueError, StatsMeter, "grpc", 0.0)

    def test_boundedMemory(self) -> None:
        """A 10 MB body in odd-size chunks never makes the meter hold more than the tail."""
        meter = StatsMeter("openai", 0.0, tailBytes=8192)
        meter.firstByte(1.0)
        event = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
        count = 10_000_000 // len(event) + 1
        body = event * count
        sizes = [1, 7, 4099, 13, 70001, 3]
        pos = i = 0
        while pos < len(body):
            size = sizes[i % len(sizes)]
            i += 1
            meter.feed(body[pos : pos + size])
            pos += size
            self.assertLessEqual(meter.retainedBytes, 8192)
        self.assertEqual(meter.retainedBytes, 8192)
        self.assertEqual(
            meter.result(2.0),
            {
                "completionTokens": count,
                "ttftMs": 1000,
                "tokensPerSecond": float(count),
                "estimated": True,
            },
        )


class EndMarkerTests(SynchronousTestCase):
    """``sawEnd`` recognises each dialect's end-of-answer event at the end of the body."""

    def test_openaiDone(self) -> None:
        """An SSE body ending in ``data: [DONE]`` has ended; one still streaming has not."""
        meter = StatsMeter("openai", 0.0)
        meter.feed(b'data: {"choices":[]}\n\n')
        self.assertFalse(meter.sawEnd())
        meter.feed(b"data: [DONE]\n\n")
        self.assertTrue(meter.sawEnd())

    def test_ollamaLoadDuration(self) -> None:
        """Ollama's ``load_duration`` (ns) on the done line is ``loadMs``: what the request
        waited for its model to load (read by the residency view); not a duration, none."""
        for load, expected in ((2_500_000_000, {"loadMs": 2500.0}), ("x", {}), (-1, {})):
            body = ndjsonBody(["a"], {"eval_count": 1, "load_duration": load})
            result = measure("ollama", body)
            assert result is not None
            self.assertEqual({k: v for k, v in result.items() if k == "loadMs"}, expected)

    def test_ollamaDoneLine(self) -> None:
        """An NDJSON body whose last line says ``"done": true`` has ended."""
        meter = StatsMeter("ollama", 0.0)
        meter.feed(b'{"message":{"content":"a"},"done":false}\n')
        self.assertFalse(meter.sawEnd())
        meter.feed(b'{"done": true, "eval_count": 1}\n')
        self.assertTrue(meter.sawEnd())


class RobustnessTests(SynchronousTestCase):
    """Hostile or tiny inputs never break the meter."""

    def test_absurdNestingIgnored(self) -> None:
        """A ``usage`` value nested deeper than the decoder's recursion limit is no usage
        (it used to escape as ``RecursionError``); the events are estimated instead."""
        body = b"data: {}\n\ndata: {}\n\ndata: " + b'{"usage":' + b"[" * 5000 + b"\n\n"
        self.assertEqual(
            measure("openai", body, tailBytes=8192),
            {"completionTokens": 3, "tokensPerSecond": 1.5, "ttftMs": 500, "estimated": True},
        )

    def test_tinyTailStillCountsSplitMarkers(self) -> None:
        """A tail shorter than an event marker still counts markers cut by every split."""
        body = b"data: a\n\ndata: b\n\ndata: c\n\n"
        for cut in range(1, len(body)):
            meter = StatsMeter("openai", 0.0, tailBytes=1)
            meter.feed(body[:cut])
            meter.feed(body[cut:])
            self.assertEqual(meter.result(1.0), {"completionTokens": 3, "estimated": True})
