"""The statistics meter on the agents' routes (spec §8): Anthropic Messages and OpenAI
Responses usage, streamed and not, with the stream's start looked at within a bound."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.stats import HEAD_BYTES, StatsMeter
from tests.support.statsbodies import measure, messagesStream, namedEvents, responsesStream

# As llama-server reports them (server-task.cpp): the cached part apart from input_tokens.
LLAMA_START = {"cache_read_input_tokens": 40, "input_tokens": 10, "output_tokens": 0}
LLAMA_DELTA = {"output_tokens": 3}


class MessagesTests(SynchronousTestCase):
    """Anthropic Messages: the prompt is input + cache read + cache creation."""

    def test_llamaStream(self) -> None:
        """llama.cpp: input and cache read in ``message_start``, output in ``message_delta``."""
        body = messagesStream(["a", "b", "c"], LLAMA_START, LLAMA_DELTA)
        self.assertEqual(
            measure("anthropic", body),
            {
                "promptTokens": 50,
                "cachedTokens": 40,
                "completionTokens": 3,
                "tokensPerSecond": 1.5,
                "ttftMs": 500,
            },
        )

    def test_ollamaStream(self) -> None:
        """Ollama: an estimate in ``message_start``, the real count again in
        ``message_delta``, which wins; no cached count (none reported)."""
        body = messagesStream(
            ["a", "b"],
            {"input_tokens": 5, "output_tokens": 0},
            {"input_tokens": 12, "output_tokens": 2},
        )
        result = measure("anthropic", body)
        assert result is not None
        self.assertEqual((result["promptTokens"], result["completionTokens"]), (12, 2))
        self.assertNotIn("cachedTokens", result)

    def test_cacheCreationCounts(self) -> None:
        """Anthropic's own: tokens written to the cache are prompt tokens too, not cached."""
        start = {
            "input_tokens": 3,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 20,
            "output_tokens": 1,
        }
        result = measure("anthropic", messagesStream(["x", "y"], start, {"output_tokens": 7}))
        assert result is not None
        self.assertEqual(
            (result["promptTokens"], result["cachedTokens"], result["completionTokens"]),
            (123, 20, 7),
        )

    def test_document(self) -> None:
        """A non-streamed answer: exact counts from its ``usage``, no throughput."""
        body = json.dumps(
            {
                "id": "chatcmpl-1",
                "type": "message",
                "content": [{"type": "text", "text": "hi " * 5000}],
                "usage": {"cache_read_input_tokens": 7, "input_tokens": 2, "output_tokens": 9},
            }
        ).encode()
        self.assertEqual(
            measure("anthropic", body, chunks=[5, 100, 4000]),
            {"promptTokens": 9, "cachedTokens": 7, "completionTokens": 9, "ttftMs": 500},
        )

    def test_longStreamKeepsTheStart(self) -> None:
        """A stream far longer than the tail still reports the input usage of its start,
        and the meter holds no more than its tail once the start was read."""
        meter = StatsMeter("anthropic", 100.0)
        meter.firstByte(100.5)
        body = messagesStream(["word "] * 5000, LLAMA_START, {"output_tokens": 5000})
        for at in range(0, len(body), 1000):
            meter.feed(body[at : at + 1000])
            self.assertLessEqual(meter.retainedBytes, 8192 + HEAD_BYTES)
        self.assertLessEqual(meter.retainedBytes, 8192)
        result = meter.result(110.5)
        assert result is not None
        self.assertEqual((result["promptTokens"], result["cachedTokens"]), (50, 40))
        self.assertEqual(result["completionTokens"], 5000)

    def test_startBeyondTheLookIsNotRead(self) -> None:
        """A ``message_start`` after the first ``HEAD_BYTES`` is not looked for: only what
        the tail says is reported."""
        pings = b":\n\n" * (HEAD_BYTES // 3 + 1)
        body = pings + messagesStream(["a", "b"], LLAMA_START, LLAMA_DELTA)
        result = measure("anthropic", body)
        assert result is not None
        self.assertNotIn("promptTokens", result)
        self.assertEqual(result["completionTokens"], 3)

    def test_startAfterAFewPings(self) -> None:
        """llama.cpp's keep-alive comments before ``message_start`` are skipped."""
        body = b":\n\n" * 20 + messagesStream(["a", "b"], LLAMA_START, LLAMA_DELTA)
        result = measure("anthropic", body, chunks=[1] * 200)
        assert result is not None
        self.assertEqual(result["promptTokens"], 50)

    def test_textNamingTheStartEventIsNotIt(self) -> None:
        """Text that says ``message_start`` inside a delta is not the start event."""
        body = namedEvents(
            [
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "delta": {"text": "message_start"}},
                )
            ]
        ) + messagesStream(["a", "b"], LLAMA_START, LLAMA_DELTA)
        result = measure("anthropic", body)
        assert result is not None
        self.assertEqual(result["promptTokens"], 50)

    def test_estimate(self) -> None:
        """No usage at all: the content deltas are counted, flagged ``estimated``."""
        result = measure("anthropic", messagesStream(["a", "b", "c", "d"], None, None))
        self.assertEqual(
            result,
            {"completionTokens": 4, "tokensPerSecond": 2.0, "ttftMs": 500, "estimated": True},
        )

    def test_sawEnd(self) -> None:
        """The stream ended for the client once its ``message_stop`` event is whole."""
        whole = messagesStream(["a"], LLAMA_START, LLAMA_DELTA)
        for cut, ended in ((len(whole), True), (len(whole) - 1, False), (len(whole) - 30, False)):
            meter = StatsMeter("anthropic", 0.0)
            meter.feed(whole[:cut])
            self.assertIs(meter.sawEnd(), ended, cut)
        meter = StatsMeter("anthropic", 0.0)
        meter.feed(messagesStream(["a"], LLAMA_START, LLAMA_DELTA, end=False))
        self.assertFalse(meter.sawEnd())


class ResponsesTests(SynchronousTestCase):
    """OpenAI Responses: ``input_tokens`` is the whole prompt (OpenAI's meaning)."""

    USAGE = {"input_tokens": 50, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 40}}

    def test_llamaStream(self) -> None:
        """llama.cpp: usage in ``response.completed``, ``timings`` beside it."""
        body = responsesStream(["a", "b", "c"], self.USAGE, {"prompt_ms": 12.5, "cache_n": 40})
        self.assertEqual(
            measure("responses", body),
            {
                "promptTokens": 50,
                "cachedTokens": 40,
                "promptMs": 12.5,
                "completionTokens": 3,
                "tokensPerSecond": 1.5,
                "ttftMs": 500,
            },
        )

    def test_uncached(self) -> None:
        """Ollama's constant ``cached_tokens: 0`` is not reported as a count."""
        usage = {
            "input_tokens": 50,
            "output_tokens": 3,
            "input_tokens_details": {"cached_tokens": 0},
        }
        result = measure("responses-uncached", responsesStream(["a", "b"], usage))
        assert result is not None
        self.assertEqual(result["promptTokens"], 50)
        self.assertNotIn("cachedTokens", result)

    def test_longOutput(self) -> None:
        """``response.completed`` repeats the whole output: longer than the tail, its usage
        (at its end) is still read, and the stream is seen to end."""
        body = responsesStream(["word "] * 4000, self.USAGE)
        meter = StatsMeter("responses", 0.0)
        meter.firstByte(1.0)
        for at in range(0, len(body), 777):
            meter.feed(body[at : at + 777])
        self.assertTrue(meter.sawEnd())
        result = meter.result(3.0)
        assert result is not None
        self.assertEqual((result["promptTokens"], result["completionTokens"]), (50, 3))

    def test_document(self) -> None:
        """A non-streamed response: exact counts, no throughput."""
        body = json.dumps({"id": "resp_1", "object": "response", "usage": self.USAGE}).encode()
        self.assertEqual(
            measure("responses", body),
            {"promptTokens": 50, "cachedTokens": 40, "completionTokens": 3, "ttftMs": 500},
        )

    def test_sawEnd(self) -> None:
        """Ended only with a whole ``response.completed`` event."""
        whole = responsesStream(["a"], self.USAGE)
        for cut, ended in ((len(whole), True), (len(whole) - 1, False)):
            meter = StatsMeter("responses", 0.0)
            meter.feed(whole[:cut])
            self.assertIs(meter.sawEnd(), ended)
        meter = StatsMeter("responses", 0.0)
        meter.feed(responsesStream(["a"], self.USAGE, end=False))
        self.assertFalse(meter.sawEnd())


# Numbers no engine can mean: each must count as not reported.
ABSURD = [10**400, 2**40, -1, 1e400, float("nan"), 1.5, True, "12", None, [1], {"a": 1}]


def absurdJSON(value: object) -> str:
    """``value`` as JSON text, 1e400 and NaN written as an engine would (JSON has no inf)."""
    if value == 1e400:
        return "1e400"
    if value != value:
        return "NaN"
    return json.dumps(value)


class BoundsTests(SynchronousTestCase):
    """Every engine-reported number is bounded (issue 32 item 4): a count in [0, 2**40),
    a duration finite and bounded; anything else is not reported, and nothing raises."""

    def test_absurdCounts(self) -> None:
        """Absurd prompt counts in every dialect are absent; the completion count stays."""
        for value in ABSURD:
            text = absurdJSON(value)
            bodies = {
                "openai": f'{{"usage":{{"prompt_tokens":{text},"completion_tokens":2}}}}',
                "responses": f'{{"usage":{{"input_tokens":{text},"output_tokens":2}}}}',
                "anthropic": f'{{"usage":{{"input_tokens":{text},"output_tokens":2}}}}',
                "ollama": f'{{"done":true,"prompt_eval_count":{text},"eval_count":2}}',
            }
            for dialect, body in bodies.items():
                result = measure(dialect, body.encode())
                assert result is not None
                self.assertNotIn("promptTokens", result, (dialect, text))
                self.assertEqual(result["completionTokens"], 2, (dialect, text))
                json.dumps(result, allow_nan=False)

    def test_largestCountKept(self) -> None:
        """2**40 - 1 is still a count."""
        body = b'{"usage":{"prompt_tokens":1099511627775,"completion_tokens":2}}'
        result = measure("openai", body)
        assert result is not None
        self.assertEqual(result["promptTokens"], 2**40 - 1)

    def test_anthropicSumBounded(self) -> None:
        """Three bounded parts whose sum is not: no prompt, no cached count."""
        part = 2**40 - 1
        usage = {"input_tokens": part, "cache_read_input_tokens": part, "output_tokens": 1}
        result = measure("anthropic", json.dumps({"usage": usage}).encode())
        assert result is not None
        self.assertEqual(set(result), {"completionTokens", "ttftMs"})

    def test_absurdDurations(self) -> None:
        """An absurd ``eval_duration`` or ``prompt_ms`` is dropped: throughput from the clock,
        no prompt time."""
        for text in ("1e400", "NaN", "-5", "0.0000001", "9.3e18", "true"):
            body = (
                b'{"done":false}\n{"done":true,"prompt_eval_count":3,"eval_count":4,'
                b'"eval_duration":%s}\n' % text.encode()
            )
            result = measure("ollama", body)
            assert result is not None
            self.assertEqual(result["tokensPerSecond"], 2.0, text)
            body = (
                b'{"usage":{"prompt_tokens":3,"completion_tokens":4},'
                b'"timings":{"prompt_ms":%s}}' % text.encode()
            )
            result = measure("openai", body)
            assert result is not None
            if text not in ("0.0000001",):
                self.assertNotIn("promptMs", result, text)
            json.dumps(result, allow_nan=False)


DIALECT_NAMES = ["openai", "ollama", "anthropic", "responses", "responses-uncached"]
FUZZ = settings(max_examples=200, deadline=None, database=None)


def chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    """``body`` cut at the given offsets."""
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(body[last:point])
        last = point
    pieces.append(body[last:])
    return pieces


class PropertyTests(SynchronousTestCase):
    """The stream parsers against arbitrary chunking and arbitrary bytes."""

    @FUZZ
    @given(
        st.lists(st.text(max_size=20), max_size=30),
        st.integers(min_value=0, max_value=2**41),
        st.integers(min_value=0, max_value=2**41),
        st.integers(min_value=0, max_value=2**41),
        st.lists(st.integers(min_value=0), max_size=12),
    )
    def test_messagesChunkingDoesNotMatter(
        self, texts: list[str], read: int, fresh: int, out: int, cuts: list[int]
    ) -> None:
        """A Messages stream cut anywhere measures as it does whole; counts bounded."""
        start = {"cache_read_input_tokens": read, "input_tokens": fresh, "output_tokens": 0}
        body = messagesStream(texts, start, {"output_tokens": out})
        whole = measure("anthropic", body)
        meter = StatsMeter("anthropic", 100.0)
        meter.firstByte(100.5)
        for piece in chunked(body, cuts):
            meter.feed(piece)
        self.assertEqual(meter.result(102.5), whole)
        self.assertTrue(meter.sawEnd())
        assert whole is not None
        if read < 2**40 and fresh < 2**40 and read + fresh < 2**40:
            self.assertEqual(whole["promptTokens"], read + fresh)
            self.assertEqual(whole["cachedTokens"], read)
        else:
            self.assertNotIn("promptTokens", whole)
        if out < 2**40:
            self.assertEqual(whole.get("completionTokens"), out)
        else:  # unreadable: absent, or counted from the events when nothing else was read
            self.assertTrue("completionTokens" not in whole or whole.get("estimated"))

    @FUZZ
    @given(
        st.lists(st.text(max_size=20), max_size=30),
        st.integers(min_value=0, max_value=2**41),
        st.integers(min_value=0, max_value=2**41),
        st.lists(st.integers(min_value=0), max_size=12),
    )
    def test_responsesChunkingDoesNotMatter(
        self, texts: list[str], prompt: int, cached: int, cuts: list[int]
    ) -> None:
        """A Responses stream cut anywhere measures as it does whole."""
        usage = {
            "input_tokens": prompt,
            "output_tokens": 1,
            "input_tokens_details": {"cached_tokens": cached},
        }
        body = responsesStream(texts, usage)
        whole = measure("responses", body)
        meter = StatsMeter("responses", 100.0)
        meter.firstByte(100.5)
        for piece in chunked(body, cuts):
            meter.feed(piece)
        self.assertEqual(meter.result(102.5), whole)
        self.assertTrue(meter.sawEnd())
        assert whole is not None
        self.assertEqual(whole.get("promptTokens"), prompt if prompt < 2**40 else None)
        expectCached = cached if prompt < 2**40 and cached <= prompt else None
        self.assertEqual(whole.get("cachedTokens"), expectCached)

    @FUZZ
    @given(
        st.sampled_from(DIALECT_NAMES),
        st.lists(
            st.binary(max_size=300)
            | st.sampled_from(
                [
                    b"event: message_start\ndata: ",
                    b'{"type":"message_start","message":{"usage":{"input_tokens":',
                    b'"usage":{"input_tokens":1e400,"output_tokens":',
                    b"99999999999999999999999999",
                    b"\nevent: message_stop\n",
                    b"\nevent: response.completed\n",
                    b'"timings":{"prompt_ms":',
                    b"content_block_delta\ndata:",
                    b"\n\n",
                ]
            ),
            max_size=40,
        ),
    )
    def test_arbitraryBytes(self, dialect: str, pieces: list[bytes]) -> None:
        """Whatever an engine sends: no exception, bounded memory, bounded finite numbers."""
        meter = StatsMeter(dialect, 100.0)
        meter.firstByte(100.5)
        for piece in pieces:
            meter.feed(piece)
            self.assertLessEqual(meter.retainedBytes, 8192 + HEAD_BYTES)
        meter.sawEnd()
        result = meter.result(101.0)
        json.dumps(result, allow_nan=False)
        for name in ("promptTokens", "cachedTokens", "completionTokens"):
            if result is not None and name in result:
                value = result[name]
                assert isinstance(value, int)
                self.assertTrue(0 <= value < 2**41)
