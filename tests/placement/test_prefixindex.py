"""The prefix index: chained block digests of prompts, per-node LRU and its bounds."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.placement.keys import AffinityKey, keyFor
from nvpair.proxy.placement.prefixindex import MIN_NODE_CHARS, PrefixIndex

CHAT = b"/v1/chat/completions"
SYSTEM = "You are the helpful assistant of ACME. " * 40  # 1,560 characters


def chat(system: str, *turns: str) -> list[dict[str, str]]:
    """The system prompt then alternating user and assistant messages."""
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


def key(doc: dict[str, object], path: bytes = CHAT) -> AffinityKey:
    found = keyFor("llamacpp", "m", path, doc)
    assert found is not None
    return found


def chatKey(system: str, *turns: str) -> AffinityKey:
    return key({"messages": chat(system, *turns)})


def synthetic(seed: int, count: int, size: int = 100) -> tuple[list[int], list[int]]:
    """``count`` chained digests of ``size``-character blocks and their ends."""
    blocks, digest = [], seed
    for _ in range(count):
        digest = hash((digest, "block"))
        blocks.append(digest)
    return blocks, [size * (i + 1) for i in range(count)]


class BlockTests(SynchronousTestCase):
    """Block digests chain, so requests agreeing on their leading material share blocks."""

    def test_sharedSystemPromptSharesBlocks(self) -> None:
        """Two users of one tenant share the system prompt's block; another tenant's
        system prompt shares none; each block ends where its message does."""
        alice = chatKey(SYSTEM, "alice asks about invoices")
        bob = chatKey(SYSTEM, "bob wants a refund")
        other = chatKey("You are the assistant of Globex.", "alice asks about invoices")
        self.assertEqual(alice.blocks[0], bob.blocks[0])
        self.assertNotEqual(alice.blocks[1], bob.blocks[1])
        self.assertFalse(set(alice.blocks) & set(other.blocks))
        self.assertEqual(alice.ends, (len(SYSTEM), len(SYSTEM) + 25))
        self.assertEqual(alice.chars, alice.ends[-1])

    def test_laterTurnExtendsEarlier(self) -> None:
        """A later turn's blocks start with every block of the earlier turn."""
        earlier = chatKey(SYSTEM, "question one")
        later = chatKey(SYSTEM, "question one", "answer one", "question two")
        self.assertEqual(later.blocks[: len(earlier.blocks)], earlier.blocks)
        self.assertEqual(len(later.blocks), 4)

    def test_promptText(self) -> None:
        """Prompt text blocks are its 256·2^k-character prefixes then the whole text: a
        longer prompt sharing a document shares its leading blocks."""
        document = "x" * 1100
        short = key({"prompt": document}, b"/v1/completions")
        longer = key({"prompt": document + "and a question"}, b"/v1/completions")
        self.assertEqual(short.ends, (256, 512, 1024, 1100))
        self.assertEqual(longer.blocks[:3], short.blocks[:3])
        self.assertNotEqual(longer.blocks[3], short.blocks[3])
        exact = key({"prompt": "y" * 512}, b"/api/generate")
        self.assertEqual(exact.ends, (256, 512))

    def test_blocksLogarithmic(self) -> None:
        """A long history records few blocks: the first four messages, every 2^k-message
        prefix and the last two turns' ends, so the next turn still meets the whole
        earlier prompt; digests only."""
        turns = [f"turn {i}" for i in range(599)]
        long = chatKey(SYSTEM, *turns)
        self.assertEqual(len(long.blocks), 13)  # 0-3, 7, 15, ..., 511, 597, 599
        self.assertTrue(all(type(d) is int for d in long.blocks))
        later = chatKey(SYSTEM, *turns, "answer", "question")
        self.assertIn(long.blocks[-1], later.blocks)
        self.assertEqual(later.blocks[:11], long.blocks[:11])


class IndexTests(SynchronousTestCase):
    """Per-node LRU of block digests: longest match per node, bounded every way."""

    def test_longestMatchPerNode(self) -> None:
        """Each node scores its longest matched prefix; a node holding none is absent."""
        index = PrefixIndex()
        alice = chatKey(SYSTEM, "alice", "answer", "more")
        bob = chatKey(SYSTEM, "bob")
        index.record("A", alice.blocks, alice.ends)
        index.record("B", alice.blocks[:1], alice.ends[:1])
        self.assertEqual(index.matches(bob.blocks), {"A": 1, "B": 1})
        self.assertEqual(index.matches(alice.blocks), {"A": 4, "B": 1})
        self.assertEqual(index.matches(chatKey("other").blocks), {})
        self.assertEqual(index.matches(()), {})
        self.assertEqual((index.roots("A"), index.heldChars("A")), (1, alice.chars))

    def test_nodeBoundDropsDeepestFirst(self) -> None:
        """Past a node's bound (characters) its least recently served blocks go, deepest
        first, so what it keeps of a prefix is always a leading part."""
        index = PrefixIndex(nodeChars=1000)
        old, oldEnds = synthetic(1, 8)
        new, newEnds = synthetic(2, 6)
        index.record("A", old, oldEnds)
        index.record("A", new, newEnds)
        self.assertEqual(index.heldChars("A"), 1000)
        self.assertEqual(index.matches(old), {"A": 4})
        self.assertEqual(index.matches(new), {"A": 6})
        for seed in range(1000):
            index.record("A", *synthetic(seed + 10, 3))
            self.assertLessEqual(index.heldChars("A"), 1000)
        self.assertEqual(len(index), 10)

    def test_totalAndNodeCountBounded(self) -> None:
        """Past the global bound the largest node gives blocks up; past the node bound the
        least recently recorded node is forgotten; memory stays constant."""
        index = PrefixIndex(nodeChars=10_000, maxTotal=150, maxNodes=4)
        for i in range(2000):
            index.record(f"n{i % 7}", *synthetic(i, 5))
            self.assertLessEqual(len(index), 150)
            self.assertLessEqual(index.nodeCount(), 4)
        self.assertEqual(index.nodeIds(), ["n1", "n2", "n3", "n4"])  # i = 1996..1999
        self.assertEqual(sum(index.held(n) for n in index.nodeIds()), len(index))

    def test_capacityFromEngine(self) -> None:
        """A reported context shrinks a node's bound (never under the minimum, never over
        the default), dropping what no longer fits."""
        index = PrefixIndex(nodeChars=100_000)
        index.record("A", *synthetic(1, 900))  # 90,000 characters
        index.setCapacity("A", 8192)  # 32 Ki characters
        self.assertEqual(index.bound("A"), 32768)
        self.assertLessEqual(index.heldChars("A"), 32768)
        index.setCapacity("A", 10)
        self.assertEqual(index.bound("A"), MIN_NODE_CHARS)
        index.setCapacity("A", 10**9)
        self.assertEqual(index.bound("A"), 100_000)

    def test_dropOlderOnMiss(self) -> None:
        """A confirmed miss drops everything the node served no later than the missed
        prefix, and keeps what it served since."""
        index = PrefixIndex()
        a, b, c = synthetic(1, 4), synthetic(2, 4), synthetic(3, 4)
        index.record("A", *a)
        stamp = index.record("A", *b)
        index.record("A", *c)
        self.assertEqual(index.stampOf("A", b[0][0]), stamp)
        self.assertEqual(index.dropOlder("A", stamp), 8)
        self.assertEqual(index.matches(a[0]), {})
        self.assertEqual(index.matches(b[0]), {})
        self.assertEqual(index.matches(c[0]), {"A": 4})
        self.assertEqual(index.dropped, 8)

    def test_forgetLeftNodes(self) -> None:
        """Nodes that left the fleet are forgotten with their blocks."""
        index = PrefixIndex()
        index.record("A", *synthetic(1, 2))
        index.record("B", *synthetic(1, 2))
        index.forget("A")
        index.forget("C")
        self.assertEqual(index.nodeIds(), ["B"])
        self.assertEqual(len(index), 2)
