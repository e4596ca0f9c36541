"""The prefix index: canonical prompt text, chained block digests, per-node LRU and bounds."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.prefixindex import (
    BLOCK_CHARS,
    MAX_BLOCKS,
    MIN_NODE_BLOCKS,
    PrefixIndex,
    blockDigests,
    promptText,
)

SYSTEM = "You are the helpful assistant of ACME. " * 40  # about 1.6k characters: 6 blocks


def messages(system: str, *user: str) -> list[dict[str, str]]:
    """The system prompt then the users' messages."""
    return [{"role": "system", "content": system}] + [
        {"role": "user", "content": text} for text in user
    ]


def chat(system: str, *user: str) -> dict[str, object]:
    """A chat body: the system prompt then the users' messages."""
    return {"model": "m", "messages": messages(system, *user)}


def blocksOf(doc: Any, kind: str = "chat") -> tuple[int, ...]:
    text = promptText(kind, doc)
    assert text is not None
    return blockDigests(7, text)


class BlockTests(SynchronousTestCase):
    """Block digests chain, so requests agreeing on their leading text share leading blocks."""

    def test_sharedSystemPromptSharesBlocks(self) -> None:
        """Two users of one tenant share the blocks their system prompt fills; another
        tenant's system prompt shares none."""
        alice = blocksOf(chat(SYSTEM, "alice asks about invoices " * 20))
        bob = blocksOf(chat(SYSTEM, "bob wants a refund " * 20))
        other = blocksOf(chat("You are the assistant of Globex. " * 50, "alice " * 50))
        shared = len(SYSTEM) // BLOCK_CHARS
        self.assertEqual(alice[:shared], bob[:shared])
        self.assertNotEqual(alice[shared + 1 :], bob[shared + 1 : len(alice)])
        self.assertFalse(set(alice) & set(other))

    def test_laterTurnExtendsEarlier(self) -> None:
        """A later turn's blocks start with every whole block of the earlier turn."""
        turn = messages(SYSTEM, "question one " * 30)
        first = {"messages": turn}
        second = {
            "messages": [
                *turn,
                {"role": "assistant", "content": "answer one " * 30},
                {"role": "user", "content": "question two"},
            ]
        }
        earlier, later = blocksOf(first), blocksOf(second)
        self.assertEqual(later[: len(earlier)], earlier)
        self.assertGreater(len(later), len(earlier))

    def test_promptAndResponses(self) -> None:
        """Completion prompts key after their system text; responses after instructions;
        a prompt shorter than a block has no blocks; other shapes have no text."""
        text = "document " * 100
        plain = blocksOf({"prompt": text}, "prompt")
        self.assertEqual(len(plain), len(text) // BLOCK_CHARS)
        self.assertEqual(blocksOf({"prompt": [text]}, "prompt"), plain)
        self.assertNotEqual(blocksOf({"prompt": text, "system": "s"}, "prompt"), plain)
        self.assertEqual(blocksOf({"input": text}, "responses"), plain)
        self.assertEqual(blocksOf({"prompt": "short"}, "prompt"), ())
        self.assertIsNone(promptText("prompt", {"prompt": [1]}))
        self.assertIsNone(promptText("chat", {"messages": "x"}))

    def test_blocksCapped(self) -> None:
        """A huge prompt hashes at most ``MAX_BLOCKS`` blocks, integers only."""
        digests = blockDigests(1, "x" * (BLOCK_CHARS * (MAX_BLOCKS + 50)))
        self.assertEqual(len(digests), MAX_BLOCKS)
        self.assertTrue(all(type(d) is int for d in digests))


class IndexTests(SynchronousTestCase):
    """Per-node LRU of block digests: longest match per node, bounded every way."""

    def test_longestMatchPerNode(self) -> None:
        """Each node scores its longest matched prefix; a node holding none is absent."""
        index = PrefixIndex()
        alice = blocksOf(chat(SYSTEM, "alice " * 100))
        bob = blocksOf(chat(SYSTEM, "bob " * 100))
        index.record("A", alice)
        index.record("B", alice[:2])
        shared = len(SYSTEM) // BLOCK_CHARS
        self.assertEqual(index.matches(bob), {"A": shared, "B": 2})
        self.assertEqual(index.matches(alice), {"A": len(alice), "B": 2})
        self.assertEqual(index.matches(blocksOf(chat("other " * 100))), {})
        self.assertEqual(index.roots("A"), 1)

    def test_nodeBoundDropsDeepestFirst(self) -> None:
        """Past a node's bound its least recently served blocks go, deepest first, so what
        it keeps of a prefix is always a leading part."""
        index = PrefixIndex(nodeBlocks=10)
        old = blockDigests(1, "o" * BLOCK_CHARS * 8)
        new = blockDigests(2, "n" * BLOCK_CHARS * 6)
        index.record("A", old)
        index.record("A", new)
        self.assertEqual(index.held("A"), 10)
        self.assertEqual(index.matches(old), {"A": 4})
        self.assertEqual(index.matches(new), {"A": 6})
        for seed in range(1000):
            index.record("A", blockDigests(seed + 10, "z" * BLOCK_CHARS * 3))
            self.assertLessEqual(index.held("A"), 10)
        self.assertEqual(len(index), 10)

    def test_totalAndNodeCountBounded(self) -> None:
        """Past the global bound the largest node gives blocks up; past the node bound the
        least recently recorded node is forgotten; memory stays constant."""
        index = PrefixIndex(nodeBlocks=100, maxTotal=150, maxNodes=4)
        for i in range(2000):
            index.record(f"n{i % 7}", blockDigests(i, "y" * BLOCK_CHARS * 5))
            self.assertLessEqual(len(index), 150)
            self.assertLessEqual(index.nodeCount(), 4)
        self.assertEqual(index.nodeIds(), ["n1", "n2", "n3", "n4"])  # i = 1996..1999
        self.assertEqual(sum(index.held(n) for n in index.nodeIds()), len(index))

    def test_capacityFromEngine(self) -> None:
        """A reported context shrinks a node's bound (never under the minimum, never over
        the default), dropping what no longer fits."""
        index = PrefixIndex(nodeBlocks=500)
        index.record("A", blockDigests(1, "a" * BLOCK_CHARS * 300))
        index.setCapacity("A", 8192)  # 32 Ki characters: 128 blocks
        self.assertEqual(index.bound("A"), 128)
        self.assertEqual(index.held("A"), 128)
        index.setCapacity("A", 10)
        self.assertEqual(index.bound("A"), MIN_NODE_BLOCKS)
        index.setCapacity("A", 10**9)
        self.assertEqual(index.bound("A"), 500)

    def test_dropOlderOnMiss(self) -> None:
        """A confirmed miss drops everything the node served no later than the missed
        prefix, and keeps what it served since."""
        index = PrefixIndex()
        a = blockDigests(1, "a" * BLOCK_CHARS * 4)
        b = blockDigests(2, "b" * BLOCK_CHARS * 4)
        c = blockDigests(3, "c" * BLOCK_CHARS * 4)
        index.record("A", a)
        stamp = index.record("A", b)
        index.record("A", c)
        self.assertEqual(index.stampOf("A", b[0]), stamp)
        self.assertEqual(index.dropOlder("A", stamp), 8)
        self.assertEqual(index.matches(a), {})
        self.assertEqual(index.matches(b), {})
        self.assertEqual(index.matches(c), {"A": 4})
        self.assertEqual(index.dropped, 8)

    def test_retainForgetsLeftNodes(self) -> None:
        """Nodes that left the fleet are forgotten with their blocks."""
        index = PrefixIndex()
        index.record("A", blockDigests(1, "a" * BLOCK_CHARS * 2))
        index.record("B", blockDigests(1, "a" * BLOCK_CHARS * 2))
        index.retain(["B"])
        self.assertEqual(index.nodeIds(), ["B"])
        self.assertEqual(len(index), 2)
