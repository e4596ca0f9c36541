"""Prompt digests for Messages and Responses bodies, scopes and hints (spec §11
"Conversation affinity", "Scopes"; issue 30 point 2, issue 32 item 10)."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.frontdoor import promptKeyer, sessionOf
from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.placement.keys import MAX_HINT, AffinityKey, keyFor, scopeOf
from nvpair.proxy.placement.promptparts import IMAGE_CHARS, MAX_DEPTH, MAX_PARTS
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node

MESSAGES, RESPONSES = b"/v1/messages", b"/v1/responses"
SYSTEM = [
    {
        "type": "text",
        "text": "You are a coding agent. " * 40,
        "cache_control": {"type": "ephemeral"},
    }
]
TOOLS = [
    {"name": "bash", "description": "run a command", "input_schema": {"type": "object"}},
    {"name": "edit", "description": "edit a file", "input_schema": {"type": "object"}},
]


def agentTurn(n: int, topic: str = "build") -> list[dict[str, Any]]:
    """The messages of the n-th turn of an agent: tool use and results grow the history;
    the newest user message carries Anthropic's ``cache_control`` marker."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"please {topic}"}]
    for i in range(n - 1):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"step {i}"},
                    {
                        "type": "tool_use",
                        "id": f"tu{i}",
                        "name": "bash",
                        "input": {"cmd": f"ls {i}"},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"tu{i}", "content": f"out {i}"}
                ],
            }
        )
    last = copy.deepcopy(messages[-1])
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    messages[-1] = last
    return messages


def messagesKey(messages: list[Any], scope: int | None = None, **extra: Any) -> AffinityKey:
    doc = {"model": "m", "system": SYSTEM, "tools": TOOLS, "messages": messages, **extra}
    key = keyFor("llamacpp", "m", MESSAGES, doc, scope)
    assert key is not None
    return key


def responsesKey(source: Any, scope: int | None = None, **extra: Any) -> AffinityKey:
    doc = {"model": "m", "instructions": "be an agent", "tools": TOOLS, "input": source, **extra}
    key = keyFor("lmstudio", "m", RESPONSES, doc, scope)
    assert key is not None
    return key


class MessagesKeyTests(SynchronousTestCase):
    """Anthropic Messages: system, tools, then messages, in render order."""

    def test_turnsExtend(self) -> None:
        """Each turn finds the last one's whole-request digest among its lookups, though
        the ``cache_control`` marker moved to the newest message."""
        keys = [messagesKey(agentTurn(n)) for n in (1, 2, 3, 4)]
        for earlier, later in zip(keys, keys[1:], strict=False):
            self.assertIn(earlier.records[0], later.lookups)
            self.assertEqual(later.blocks[:2], earlier.blocks[:2])

    def test_agentsShareSystemAndTools(self) -> None:
        """Two agents of one app (same system prompt and tools, other tasks) share the
        leading blocks up to the tools; another system prompt or other tools share none."""
        a, b = messagesKey(agentTurn(2, "build")), messagesKey(agentTurn(2, "test"))
        self.assertEqual(a.blocks[:2], b.blocks[:2])
        self.assertNotEqual(a.blocks[2], b.blocks[2])
        self.assertEqual(a.ends[0], len(SYSTEM[0]["text"]))
        other = keyFor(
            "llamacpp", "m", MESSAGES, {"system": "other", "tools": TOOLS, "messages": agentTurn(2)}
        )
        tools = keyFor(
            "llamacpp",
            "m",
            MESSAGES,
            {"system": SYSTEM, "tools": TOOLS[:1], "messages": agentTurn(2)},
        )
        assert other is not None and tools is not None
        self.assertNotEqual(other.blocks[0], a.blocks[0])
        self.assertEqual(tools.blocks[0], a.blocks[0])
        self.assertNotEqual(tools.blocks[1], a.blocks[1])

    def test_textShapesAlike(self) -> None:
        """A message given as a string or as one text block keys alike; key order in a
        block does not matter; a tool input that differs does."""
        plain = messagesKey([{"role": "user", "content": "hi"}])
        block = messagesKey([{"role": "user", "content": [{"text": "hi", "type": "text"}]}])
        self.assertEqual(plain.records, block.records)
        use = agentTurn(2)
        changed = copy.deepcopy(use)
        changed[1]["content"][1]["input"]["cmd"] = "rm"
        self.assertNotEqual(messagesKey(use).records, messagesKey(changed).records)

    def test_imagesByDigest(self) -> None:
        """An image counts ``IMAGE_CHARS`` characters whatever its size, and two images
        differ by their data."""

        def image(data: str) -> dict[str, Any]:
            source = {"type": "base64", "media_type": "image/png", "data": data}
            return {"role": "user", "content": [{"type": "image", "source": source}]}

        big, other = messagesKey([image("A" * 1_000_000)]), messagesKey([image("B" * 1_000_000)])
        self.assertEqual(big.ends[-1] - big.ends[-2], IMAGE_CHARS)
        self.assertNotEqual(big.records, other.records)
        self.assertEqual(big.records, messagesKey([image("A" * 1_000_000)]).records)

    def test_bounds(self) -> None:
        """No messages, too many parts or nesting past ``MAX_DEPTH``: no key."""
        self.assertIsNone(keyFor("llamacpp", "m", MESSAGES, {"system": "s", "messages": []}))
        many = [{"role": "user", "content": "x"}] * MAX_PARTS
        self.assertIsNone(keyFor("llamacpp", "m", MESSAGES, {"system": "s", "messages": many}))
        deep: Any = "x"
        for _ in range(MAX_DEPTH + 1):
            deep = [deep]
        self.assertIsNone(
            keyFor("llamacpp", "m", MESSAGES, {"messages": [{"role": "user", "content": deep}]})
        )

    def test_digestsOnly(self) -> None:
        """A key holds integers only, never text."""
        key = messagesKey(agentTurn(3))
        for value in (*key.lookups, *key.records, *key.blocks, *key.ends):
            self.assertIs(type(value), int)


class ResponsesKeyTests(SynchronousTestCase):
    """OpenAI Responses: instructions, tools, then input."""

    def test_itemsExtend(self) -> None:
        """A conversation resent whole (as Codex does with ``store: false``) extends the
        last turn: messages, function calls, their outputs and reasoning items."""
        first = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "fix it"}],
            }
        ]
        second = [
            *first,
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": '{"cmd":"ls"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        ]
        a, b = responsesKey(first), responsesKey(second)
        self.assertIn(a.records[0], b.lookups)
        self.assertEqual(a.blocks[:2], b.blocks[:2])

    def test_stringInputIsOneUserTurn(self) -> None:
        """A string input keys as the one user message it stands for."""
        self.assertEqual(
            responsesKey("hello").records,
            responsesKey([{"role": "user", "content": "hello"}]).records,
        )

    def test_instructionsAreAPrefix(self) -> None:
        """Other instructions share nothing; the same instructions and tools share the
        first two blocks."""
        a, b = responsesKey("one"), responsesKey("two")
        self.assertEqual(a.blocks[:2], b.blocks[:2])
        c = keyFor(
            "lmstudio", "m", RESPONSES, {"instructions": "other", "tools": TOOLS, "input": "one"}
        )
        assert c is not None
        self.assertNotEqual(c.blocks[0], a.blocks[0])


class ScopeTests(SynchronousTestCase):
    """Scopes (issue 32 item 10): different keys never match each other's prefixes."""

    def test_scopesSeedEveryDigest(self) -> None:
        """The same prompt under two keys shares no digest; under the same key, or with no
        key at all, it does."""
        alice, bob = scopeOf(b"Bearer alice", False), scopeOf(b"Bearer bob", False)
        a, b = messagesKey(agentTurn(2), alice), messagesKey(agentTurn(2), bob)
        self.assertFalse(set(a.blocks) & set(b.blocks))
        self.assertFalse(set(a.lookups) & set(b.records))
        self.assertEqual(
            a.blocks, messagesKey(agentTurn(2), scopeOf(b"Bearer alice", False)).blocks
        )
        self.assertIsNone(scopeOf(None, False))
        self.assertIsNone(scopeOf(b"", False))
        self.assertIsNone(scopeOf(b"Bearer alice", True))

    def test_userFieldsNeverSplit(self) -> None:
        """``user``, ``safety_identifier`` and ``metadata.user_id`` leave the digests alone:
        the users of one app keep sharing its system prompt."""
        plain = messagesKey(agentTurn(2))
        tagged = messagesKey(
            agentTurn(2), metadata={"user_id": "u1"}, user="u2", safety_identifier="u3"
        )
        self.assertEqual(plain.blocks, tagged.blocks)
        self.assertEqual(plain.records, tagged.records)

    def test_frontDoorScopes(self) -> None:
        """The front door's keyer scopes by the request's ``Authorization``, unless the
        fleet file shares prefixes; a single-node fleet or no affinity takes no digests."""
        context = FakeContext()
        facade = makeFacade(context.clock, [node("A"), node("B")])
        doc: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}]}
        self.assertIsNone(promptKeyer(context, facade, FakeRequest()))
        context.affinity = Affinity(context.clock, context.reservations)

        def blocks(auth: bytes | None) -> tuple[int, ...]:
            headers = {b"authorization": [auth]} if auth else {}
            keyer = promptKeyer(context, facade, FakeRequest(headers=headers))
            assert keyer is not None
            key = keyer("m1", doc)
            assert key is not None
            return key.blocks

        self.assertNotEqual(blocks(b"Bearer a"), blocks(b"Bearer b"))
        self.assertEqual(blocks(b"Bearer a"), blocks(b"Bearer a"))
        self.assertNotEqual(blocks(b"Bearer a"), blocks(None))
        context.affinity.sharesPrefixes = lambda: True
        self.assertEqual(blocks(b"Bearer a"), blocks(b"Bearer b"))
        self.assertEqual(blocks(b"Bearer a"), blocks(None))
        single = makeFacade(context.clock, [node("A")])
        self.assertIsNone(promptKeyer(context, single, FakeRequest()))


class HintTests(SynchronousTestCase):
    """``prompt_cache_key`` groups requests and names the spread; ``cache_prompt: false``
    confirms nothing."""

    def test_hintGroups(self) -> None:
        """The hint's digest is looked up first, recorded, and is the spread; other prompts
        with the same hint share it, another hint or scope does not."""
        a = responsesKey("one", prompt_cache_key="g")
        b = responsesKey("two", prompt_cache_key="g")
        self.assertEqual(a.lookups[0], b.lookups[0])
        self.assertEqual((a.spread, a.records[0]), (a.lookups[0], a.lookups[0]))
        self.assertIn(b.lookups[0], a.records)
        self.assertNotEqual(responsesKey("one", prompt_cache_key="h").spread, a.spread)
        self.assertNotEqual(
            responsesKey("one", scopeOf(b"k", False), prompt_cache_key="g").spread, a.spread
        )
        self.assertNotIn(a.spread, responsesKey("one").lookups)

    def test_hintAlone(self) -> None:
        """A hint keys a request whose prompt has none; an over-long or empty one is no
        hint."""
        key = keyFor(
            "llamacpp", "m", b"/v1/chat/completions", {"messages": [], "prompt_cache_key": "g"}
        )
        assert key is not None
        self.assertEqual((key.blocks, len(key.lookups)), ((), 1))
        for hint in ("", "g" * (MAX_HINT + 1), 5):
            self.assertIsNone(
                keyFor(
                    "llamacpp",
                    "m",
                    b"/v1/chat/completions",
                    {"messages": [], "prompt_cache_key": hint},
                )
            )

    def test_sessionHeaderIsALastHint(self) -> None:
        """An agent CLI's session header is looked up after the prompt's own digests and
        recorded; the front door reads it from the request (``sessionOf``)."""
        doc = {"model": "m", "system": "s", "messages": agentTurn(1)}
        plain = keyFor("llamacpp", "m", b"/v1/messages", doc)
        tagged = keyFor("llamacpp", "m", b"/v1/messages", doc, session=b"abc")
        other = keyFor("llamacpp", "m", b"/v1/messages", {**doc, "system": "t"}, session=b"abc")
        assert plain is not None and tagged is not None and other is not None
        self.assertEqual(tagged.lookups[:-1], plain.lookups)
        self.assertEqual(tagged.lookups[-1], other.lookups[-1])
        self.assertIn(tagged.lookups[-1], tagged.records)
        self.assertEqual(tagged.spread, plain.spread)
        request = FakeRequest(headers={b"x-claude-code-session-id": [b"abc"]})
        self.assertEqual(sessionOf(request), b"abc")
        self.assertIsNone(sessionOf(FakeRequest()))

    def test_cachePromptFalse(self) -> None:
        """A request that asks for no cache reuse keys as usual but confirms nothing."""
        self.assertTrue(responsesKey("x").confirms)
        self.assertFalse(responsesKey("x", cache_prompt=False).confirms)
        self.assertTrue(responsesKey("x", cache_prompt=True).confirms)


class NoCacheTests(SynchronousTestCase):
    """One client's ``cache_prompt: false`` drops no entry (issue 32 item 10)."""

    def test_missConfirmsNothing(self) -> None:
        """A node expected to hold a prefix reports nothing cached: a request that asked for
        no cache reuse leaves every entry (and the counts) alone; the same answer to an
        ordinary request drops the node's stale entries."""
        affinity = Affinity(Clock(), ReservationMap())
        affinity.index.record("A", [1, 2], [4000, 8000])
        for cachePrompt, dropped in ((False, 0), (True, 2)):
            key = messagesKey(agentTurn(2), cache_prompt=cachePrompt)
            key.expect = ("A", 8000, 1)
            affinity.ended(key, "A", prompt=3000, cached=0)
            self.assertEqual(affinity.index.dropped, dropped)
        self.assertEqual((affinity.expectedHits, affinity.expectedMisses), (0, 1))


class PropertyTests(SynchronousTestCase):
    """Keys of arbitrary JSON bodies: never an error, integers only."""

    @settings(max_examples=150, deadline=None, database=None)
    @given(
        st.sampled_from([MESSAGES, RESPONSES, b"/v1/chat/completions", b"/api/generate"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=10),
            lambda c: (
                st.lists(c, max_size=4)
                | st.dictionaries(
                    st.sampled_from(
                        [
                            "role",
                            "content",
                            "type",
                            "text",
                            "system",
                            "tools",
                            "messages",
                            "input",
                            "instructions",
                            "prompt",
                            "cache_control",
                        ]
                    ),
                    c,
                    max_size=5,
                )
            ),
            max_leaves=25,
        ),
    )
    def test_anyBody(self, path: bytes, doc: object) -> None:
        """Whatever the parsed body, a key of integers or None; the same body keys the
        same."""
        key = keyFor("llamacpp", "m", path, doc)
        if key is not None:
            for value in (*key.lookups, *key.records, *key.blocks, *key.ends):
                self.assertIs(type(value), int)
            again = keyFor("llamacpp", "m", path, json.loads(json.dumps(doc)))
            assert again is not None
            self.assertEqual(again.records, key.records)
