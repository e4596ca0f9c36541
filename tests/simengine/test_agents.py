"""The simulated engine's agents' APIs (spec §16): Messages and Responses in each dialect,
their streams and usage, token counts, the prefix cache across turns, LM Studio's stored
responses; on a MemoryReactorClock."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.testing.simengine.agents.render import messagesWords, responsesWords
from nvpair.proxy.testing.simengine.agents.stored import StoredResponses
from tests.simengine.helpers import Answer, Harness, post, sentence

SYSTEM = sentence(200, "s")
TOOLS = [{"name": "read", "description": sentence(40, "d"), "input_schema": {"type": "object"}}]


def message(*turns: object, **extra: object) -> dict[str, Any]:
    """A Messages request: the shared system prompt and tools, then alternating turns."""
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)
    ]
    return {
        "model": "m",
        "max_tokens": 4,
        "system": [{"type": "text", "text": SYSTEM}],
        "tools": TOOLS,
        "messages": messages,
        **extra,
    }


def named(answer: Answer) -> list[tuple[str, Any]]:
    """The (event name, data) pairs of a named-event SSE body."""
    out = []
    for block in answer.body.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        if b"event" in lines:
            out.append((lines[b"event"].decode(), json.loads(lines[b"data"])))
    return out


class MessagesTests(SynchronousTestCase):
    """``POST /v1/messages``."""

    def test_llamaDocument(self) -> None:
        """Non-streamed: a message with the answer's text and llama-server's usage (the
        cached part apart from ``input_tokens``); its id names the engine."""
        h = Harness(dialect="llamacpp", name="e1", blockSize=4)
        doc = h.exchange(post(b"/v1/messages", message("hi there"))).json()
        self.assertEqual(doc["id"], "msg_e1_1")
        self.assertEqual(
            (doc["type"], doc["role"], doc["stop_reason"]), ("message", "assistant", "end_turn")
        )
        self.assertEqual(doc["content"], [{"type": "text", "text": "tok0 tok1 tok2 tok3"}])
        prompt = len(messagesWords(message("hi there")) or [])
        self.assertEqual(
            doc["usage"], {"cache_read_input_tokens": 0, "input_tokens": prompt, "output_tokens": 4}
        )

    def test_llamaStream(self) -> None:
        """Streamed: the real event sequence; ``message_start`` has the input usage,
        ``message_delta`` the output only."""
        h = Harness(dialect="llamacpp")
        answer = h.exchange(post(b"/v1/messages", message("hi", stream=True)))
        self.assertEqual(answer.headers[b"content-type"], b"text/event-stream")
        events = named(answer)
        self.assertEqual(
            [name for name, _ in events],
            ["message_start", "content_block_start"]
            + ["content_block_delta"] * 4
            + ["content_block_stop", "message_delta", "message_stop"],
        )
        self.assertEqual(events[0][1]["message"]["usage"]["output_tokens"], 0)
        self.assertIn("input_tokens", events[0][1]["message"]["usage"])
        self.assertEqual(events[-2][1]["usage"], {"output_tokens": 4})
        text = "".join(
            data["delta"]["text"] for name, data in events if name == "content_block_delta"
        )
        self.assertEqual(text, "tok0 tok1 tok2 tok3")

    def test_nextTurnHitsTheCache(self) -> None:
        """A turn that extends the previous one (its answer as the assistant's text block)
        finds the previous prompt and answer cached."""
        h = Harness(dialect="llamacpp", blockSize=4)
        first = h.exchange(post(b"/v1/messages", message("first question"))).json()
        answer = [{"type": "text", "text": first["content"][0]["text"]}]
        second = h.exchange(post(b"/v1/messages", message("first question", answer, "next"))).json()
        before = len(messagesWords(message("first question")) or []) + 4
        usage = second["usage"]
        self.assertGreaterEqual(usage["cache_read_input_tokens"], before - 4)
        self.assertEqual(
            usage["cache_read_input_tokens"] + usage["input_tokens"],
            len(messagesWords(message("first question", answer, "next")) or []),
        )

    def test_toolUseAndResults(self) -> None:
        """Tool use and tool result blocks are part of the prompt."""
        use = [{"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a b c"}}]
        result = [{"type": "tool_result", "tool_use_id": "t1", "content": "x y z"}]
        plain = messagesWords(message("go"))
        withTools = messagesWords(message("go", use, result))
        assert plain is not None and withTools is not None
        self.assertIn("<|tool_use|>", withTools)
        self.assertIn("<|tool_result|>", withTools)
        self.assertEqual(withTools[: len(plain) - 1], plain[:-1])

    def test_imagesOneTokenPerDigest(self) -> None:
        """An image is one token naming a digest of its source."""
        a = {"type": "image", "source": {"type": "base64", "data": "AAAA"}}
        b = {"type": "image", "source": {"type": "base64", "data": "BBBB"}}
        wa = messagesWords(message([a, {"type": "text", "text": "what"}])) or []
        wb = messagesWords(message([b, {"type": "text", "text": "what"}])) or []
        self.assertEqual(len(wa), len(wb))
        self.assertNotEqual(wa, wb)
        self.assertEqual(wa, messagesWords(message([a, {"type": "text", "text": "what"}])))

    def test_ollama(self) -> None:
        """Ollama: the whole prompt as ``input_tokens``, no cache fields, both counts again
        in ``message_delta``; an unknown model is 404 in Anthropic's shape."""
        h = Harness(dialect="ollama", models=("m:latest",))
        events = named(h.exchange(post(b"/v1/messages", message("hi", stream=True))))
        start = events[0][1]["message"]["usage"]
        self.assertEqual(set(start), {"input_tokens", "output_tokens"})
        self.assertEqual(
            events[-2][1]["usage"], {"input_tokens": start["input_tokens"], "output_tokens": 4}
        )
        answer = h.exchange(post(b"/v1/messages", {**message("hi"), "model": "zz"}))
        self.assertEqual(answer.status, 404)
        self.assertEqual(answer.json()["type"], "error")
        self.assertEqual(answer.json()["error"]["type"], "not_found_error")

    def test_countTokens(self) -> None:
        """llama.cpp counts a Messages prompt; Ollama and LM Studio do not serve it."""
        h = Harness(dialect="llamacpp")
        doc = h.exchange(post(b"/v1/messages/count_tokens", message("count me"))).json()
        self.assertEqual(doc, {"input_tokens": len(messagesWords(message("count me")) or [])})
        for dialect in ("ollama", "lmstudio"):
            h = Harness(dialect=dialect)
            self.assertEqual(
                h.exchange(post(b"/v1/messages/count_tokens", message("x"))).status, 404
            )

    def test_busyIs503Overloaded(self) -> None:
        """A full FIFO refuses with 503, ``overloaded_error`` on LM Studio's Messages."""
        h = Harness(dialect="lmstudio", slots=1, queueMax=0)
        h.send(post(b"/v1/messages", message("a")))
        answer = h.exchange(post(b"/v1/messages", message("b")))
        self.assertEqual(answer.status, 503)
        self.assertEqual(answer.json()["error"]["type"], "overloaded_error")


def responses(given: object, **extra: object) -> dict[str, Any]:
    """A Responses request with the shared instructions and tools."""
    return {
        "model": "m",
        "instructions": SYSTEM,
        "tools": TOOLS,
        "input": given,
        "max_output_tokens": 3,
        **extra,
    }


class ResponsesTests(SynchronousTestCase):
    """``POST /v1/responses``."""

    def test_llamaStream(self) -> None:
        """The event sequence; ``response.completed`` carries the usage (the whole prompt,
        the cached part in its details) and ``timings`` beside the response."""
        h = Harness(dialect="llamacpp", name="e2")
        events = named(h.exchange(post(b"/v1/responses", responses("hello", stream=True))))
        names = [name for name, _ in events]
        self.assertEqual(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
            ]
            + ["response.output_text.delta"] * 3
            + [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ],
        )
        self.assertEqual([data["sequence_number"] for _, data in events], list(range(len(events))))
        done = events[-1][1]
        self.assertEqual(done["response"]["id"], "resp_e2_1")
        usage = done["response"]["usage"]
        self.assertEqual(usage["input_tokens"], len(responsesWords(responses("hello")) or []))
        self.assertEqual(usage["input_tokens_details"], {"cached_tokens": 0})
        self.assertIn("prompt_ms", done["timings"])
        self.assertEqual(done["response"]["output"][0]["content"][0]["text"], "tok0 tok1 tok2")

    def test_llamaRefusesPreviousResponseId(self) -> None:
        """llama.cpp: 400 in its own words."""
        h = Harness(dialect="llamacpp")
        answer = h.exchange(post(b"/v1/responses", responses("x", previous_response_id="resp_1")))
        self.assertEqual(answer.status, 400)
        self.assertEqual(
            answer.json()["error"]["message"], "llama.cpp does not support 'previous_response_id'."
        )

    def test_inputTokens(self) -> None:
        """llama.cpp's ``/v1/responses/input_tokens``."""
        h = Harness(dialect="llamacpp")
        doc = h.exchange(post(b"/v1/responses/input_tokens", responses("x y"))).json()
        self.assertEqual(
            doc,
            {
                "input_tokens": len(responsesWords(responses("x y")) or []),
                "object": "response.input_tokens",
            },
        )

    def test_lmstudioFollowUpContinuesAndHits(self) -> None:
        """LM Studio: a follow-up naming a stored response is that conversation plus its new
        input, and finds it cached."""
        h = Harness(dialect="lmstudio", name="lm", blockSize=4)
        first = h.exchange(post(b"/v1/responses", responses("first"))).json()
        self.assertEqual(first["id"], "resp_lm_1")
        self.assertEqual(set(first["usage"]), {"input_tokens", "output_tokens", "total_tokens"})
        follow = {"model": "m", "input": "second", "previous_response_id": first["id"]}
        second = h.exchange(post(b"/v1/responses", follow)).json()
        self.assertEqual(second["previous_response_id"], "resp_lm_1")
        # The stored prompt, its 3-token answer, then "<|user|> second <|assistant|>".
        expected = first["usage"]["input_tokens"] + 3 + 3
        self.assertEqual(second["usage"]["input_tokens"], expected)
        self.assertGreaterEqual(h.engine.stats.cachedTokens, first["usage"]["input_tokens"] - 4)

    def test_lmstudioUnknownId(self) -> None:
        """An unknown id: 404 in OpenAI's words; ``store: false`` keeps nothing."""
        h = Harness(dialect="lmstudio")
        unstored = h.exchange(post(b"/v1/responses", responses("a", store=False))).json()
        for missing in ("resp_nope", unstored["id"]):
            answer = h.exchange(
                post(
                    b"/v1/responses", {"model": "m", "input": "b", "previous_response_id": missing}
                )
            )
            self.assertEqual(answer.status, 404)
            self.assertEqual(
                answer.json(),
                {
                    "error": {
                        "message": f"Previous response with id '{missing}' not found.",
                        "type": "invalid_request_error",
                        "param": "previous_response_id",
                        "code": "previous_response_not_found",
                    }
                },
            )

    def test_ollamaIsStateless(self) -> None:
        """Ollama drops ``previous_response_id``: the prompt is the new input alone; its
        cached count is always 0."""
        h = Harness(dialect="ollama", models=("m:latest",))
        first = h.exchange(post(b"/v1/responses", responses("first"))).json()
        follow = {"model": "m", "input": "second", "previous_response_id": first["id"]}
        second = h.exchange(post(b"/v1/responses", follow)).json()
        self.assertEqual(second["usage"]["input_tokens"], 3)
        self.assertEqual(second["usage"]["input_tokens_details"], {"cached_tokens": 0})

    def test_historyItemsRenderLikeTheConversation(self) -> None:
        """Sending the whole history as items renders as the stored conversation did."""
        first = responsesWords(responses("q1")) or []
        items = [
            {"role": "user", "content": "q1"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "tok0 tok1 tok2"}],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "q2"}]},
        ]
        history = responsesWords(responses(items)) or []
        self.assertEqual(history[: len(first) + 3], first + ["tok0", "tok1", "tok2"])


class StoredTests(SynchronousTestCase):
    """The stored responses' table is bounded."""

    def test_bounded(self) -> None:
        """Past its capacity the least recently used response is forgotten."""
        table = StoredResponses(3)
        for i in range(5):
            table.store(f"r{i}", ["a", str(i)])
        self.assertEqual(len(table), 3)
        self.assertIsNone(table.conversation("r0"))
        self.assertEqual(table.conversation("r2"), ["a", "2"])
        table.store("r5", ["x"])
        self.assertIsNone(table.conversation("r3"))
        self.assertEqual(table.conversation("r2"), ["a", "2"])


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(
    ["system", "tools", "messages", "input", "instructions", "role", "content", "type", "text"]
)
docs = st.dictionaries(keys, values, max_size=5)


class RenderPropertyTests(SynchronousTestCase):
    """Rendering any request document."""

    @settings(max_examples=300, deadline=None, database=None)
    @given(docs)
    def test_anyDocument(self, doc: dict[str, Any]) -> None:
        """Never raises; tokens never hold whitespace (a stored conversation round-trips)."""
        for rendered in (messagesWords(doc), responsesWords(doc)):
            if rendered is not None:
                self.assertEqual(rendered[-1], "<|assistant|>")
                for word in rendered:
                    self.assertEqual(word.split(), [word])
