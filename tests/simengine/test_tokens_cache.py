"""The simulated engine's tokenizer, block digests, prefix cache and slots, as pure values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.testing.simengine import Job, PrefixCache, Slots
from nvpair.proxy.testing.simengine.tokens import (
    blockDigests,
    chatWords,
    outputText,
    promptWords,
    tokenId,
    words,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


class TokenTests(SynchronousTestCase):
    """Tokens are words; a chat is templated so its next turn extends it."""

    def test_wordsAndIds(self) -> None:
        """Whitespace splits tokens; ids are stable and in the vocabulary."""
        self.assertEqual(words(" a  b\nc "), ["a", "b", "c"])
        self.assertEqual(tokenId("hello"), tokenId("hello"))
        self.assertTrue(0 <= tokenId("hello") < 32000)

    def test_chatTemplate(self) -> None:
        """Each message is its role marker and words; the generation marker ends the prompt."""
        self.assertEqual(
            chatWords(
                [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]
            ),
            ["<|system|>", "be", "nice", "<|user|>", "hi", "<|assistant|>"],
        )

    def test_nextTurnExtendsPrompt(self) -> None:
        """Prompt + answer of one turn is exactly the start of the next turn's prompt."""
        first = [{"role": "user", "content": "hi"}]
        answer = outputText(3)
        second = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "x"},
        ]
        done = chatWords(first) + words(answer)
        self.assertEqual(chatWords(second)[: len(done)], done)

    def test_contentParts(self) -> None:
        """List content counts its text parts."""
        doc = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]}
        self.assertEqual(promptWords(doc, chat=True), ["<|user|>", "a", "b", "<|assistant|>"])

    def test_ollamaSystemFirst(self) -> None:
        """A generate request's system prompt comes before its prompt."""
        self.assertEqual(promptWords({"system": "s t", "prompt": "p"}, chat=False), ["s", "t", "p"])

    def test_noPrompt(self) -> None:
        """A request without messages (chat) or prompt (completion) has no prompt."""
        self.assertIsNone(promptWords({"prompt": 3}, chat=False))
        self.assertIsNone(promptWords({"messages": "x"}, chat=True))

    @given(st.dictionaries(st.sampled_from(["messages", "prompt", "system", "x"]), _json))
    def test_anyDocument(self, doc: dict[str, object]) -> None:
        """Any JSON object gives a list of string tokens or None, never an exception."""
        for chat in (True, False):
            found = promptWords(doc, chat)
            self.assertTrue(found is None or all(isinstance(w, str) for w in found))


class DigestTests(SynchronousTestCase):
    """Block digests chain: a block matches only if everything before it matches."""

    def test_fullBlocksOnly(self) -> None:
        """Only full blocks are digested."""
        self.assertEqual(len(blockDigests("m", list(range(35)), 16)), 2)

    def test_sharedPrefix(self) -> None:
        """Two prompts sharing 32 tokens share exactly their first two blocks."""
        a = blockDigests("m", [*range(32), *range(100, 132)], 16)
        b = blockDigests("m", [*range(32), *range(200, 232)], 16)
        self.assertEqual(a[:2], b[:2])
        self.assertNotEqual(a[2], b[2])

    def test_chained(self) -> None:
        """Equal blocks after different beginnings differ; so do different models."""
        a = blockDigests("m", [*range(16), *range(16)], 16)
        self.assertNotEqual(a[0], a[1])
        self.assertNotEqual(
            blockDigests("m", list(range(16)), 16), blockDigests("n", list(range(16)), 16)
        )


class PrefixCacheTests(SynchronousTestCase):
    """An LRU of blocks, bounded by its capacity."""

    def test_matchLeadingBlocks(self) -> None:
        """match counts the leading held blocks and stops at the first missing one."""
        cache = PrefixCache(10)
        cache.insert([b"a", b"b", b"c"])
        self.assertEqual(cache.match([b"a", b"b", b"x", b"c"]), 2)
        self.assertEqual(cache.match([b"x", b"a"]), 0)

    def test_evictsLeastRecentlyUsed(self) -> None:
        """Past capacity the least recently used block goes; a hit refreshes a block."""
        cache = PrefixCache(3)
        cache.insert([b"a", b"b", b"c"])
        self.assertEqual(cache.match([b"a"]), 1)  # a is now the most recent
        cache.insert([b"d"])
        self.assertNotIn(b"b", cache)
        self.assertIn(b"a", cache)
        self.assertEqual(cache.evictions, 1)

    def test_boundedPastCapacity(self) -> None:
        """Filling far past capacity keeps exactly capacity blocks, the newest."""
        cache = PrefixCache(50)
        for i in range(1000):
            cache.insert([i.to_bytes(4, "big")])
        self.assertEqual(len(cache), 50)
        self.assertIn((999).to_bytes(4, "big"), cache)
        self.assertEqual(cache.evictions, 950)

    def test_zeroCapacity(self) -> None:
        """A cache of no blocks holds nothing."""
        cache = PrefixCache(0)
        cache.insert([b"a"])
        self.assertEqual(cache.match([b"a"]), 0)


class SlotsTests(SynchronousTestCase):
    """N slots, a bounded FIFO behind them, held slots, queue waits on the clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.started: list[tuple[str, int]] = []
        self.slots = Slots(self.clock, 2, queueMax=2)

    def job(self, name: str) -> Job:
        """A job that records when it starts."""
        return Job(lambda slot: self.started.append((name, slot)))

    def test_fifo(self) -> None:
        """Two start at once; the others wait and start in arrival order as slots free."""
        jobs = [self.job(n) for n in "abcd"]
        self.assertEqual([self.slots.submit(j) for j in jobs], [True] * 4)
        self.assertEqual(self.started, [("a", 0), ("b", 1)])
        self.assertEqual((self.slots.busy, self.slots.queued), (2, 2))
        self.clock.advance(3)
        self.slots.release(jobs[1])
        self.assertEqual(self.started[-1], ("c", 1))
        self.assertEqual(jobs[2].waited, 3)
        self.slots.release(jobs[0])
        self.assertEqual(self.started[-1], ("d", 0))
        self.assertEqual((self.slots.waits, self.slots.waitMax), (4, 3))

    def test_queueBound(self) -> None:
        """Past the bound a job is refused and nothing changes."""
        for n in "abcd":
            self.slots.submit(self.job(n))
        self.assertFalse(self.slots.submit(self.job("e")))
        self.assertEqual((self.slots.busy, self.slots.queued), (2, 2))

    def test_cancelQueued(self) -> None:
        """A queued job released leaves the queue and never starts."""
        jobs = [self.job(n) for n in "abc"]
        for j in jobs:
            self.slots.submit(j)
        self.slots.release(jobs[2])
        self.slots.release(jobs[0])
        self.assertEqual([n for n, _ in self.started], ["a", "b"])
        self.assertEqual(self.slots.queued, 0)

    def test_hold(self) -> None:
        """Held slots are busy, taken before the queue as they free, and given back."""
        a, b, c = (self.job(n) for n in "abc")
        self.slots.submit(a)
        self.slots.hold(2)
        self.assertEqual(self.slots.held, 1)
        self.slots.submit(b)
        self.slots.release(a)
        self.assertEqual((self.slots.held, self.slots.queued), (2, 1))
        self.slots.submit(c)
        self.slots.hold(0)
        self.assertEqual([n for n, _ in self.started], ["a", "b", "c"])
        self.assertEqual(self.slots.held, 0)

    def test_tasksNumbered(self) -> None:
        """Each started job gets the next task id."""
        a, b = self.job("a"), self.job("b")
        self.slots.submit(a)
        self.slots.submit(b)
        self.assertEqual((a.task, b.task), (1, 2))
        self.assertIs(self.slots.jobAt(1), b)
