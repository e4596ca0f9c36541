"""The prefix index (spec §11.1): which node recently served which leading blocks of prompts.

A request's prompt material is cut in *blocks*, each with a digest covering everything
before it (``affinity.keyFor`` computes them), so two requests share a block's digest
exactly when they agree up to its end: a shared system prompt, a shared document or an
earlier turn all match by their leading blocks.  The block unit needs no tokenizer: on chat
routes a block ends at a message boundary (the chained message digests the conversation
keys compute anyway), taken after each of the first four messages, after 2^k messages, and
after the last and the third-last message (so a later turn meets the earlier turn's whole
prompt), its end counted in characters of content; for prompt text the blocks are its
prefixes of 256·2^k characters and the whole text.  At most ``MAX_BLOCKS`` per request.

``PrefixIndex`` keeps, per node, the block digests it served most recently (an LRU bounded
in characters by an estimate of what that engine can hold, ``NODE_CHARS`` by default) under
a global bound ``MAX_TOTAL`` on (digest, node) pairs and ``MAX_NODES`` nodes, so its memory
is constant under any load.  A request's blocks are recorded deepest first, so a node's LRU
always drops the deepest blocks of a prefix before its leading ones and a node holding block
*i* holds every block before it.  Digests are Python's per-process keyed ``hash`` (never
text).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["MAX_BLOCKS", "PrefixIndex"]

MAX_BLOCKS = 512  # blocks per request that count, at most
NODE_CHARS = 1 << 20  # a node's default bound: 1 Mi characters (about 256 Ki tokens)
MIN_NODE_CHARS = 1 << 14  # the least a reported capacity sets a node's bound to
MAX_TOTAL = 1 << 18  # (digest, node) pairs over all nodes
MAX_NODES = 256  # nodes tracked; the least recently recorded goes beyond
CHARS_PER_TOKEN = 4  # how reported token capacities become characters


class _NodeBlocks:
    """One node's blocks, least recently served first: digest -> (stamp, is a first block,
    characters), their characters in all, and its bound in characters."""

    __slots__ = ("blocks", "roots", "chars", "bound")

    def __init__(self, bound: int) -> None:
        self.blocks: OrderedDict[int, tuple[int, bool, int]] = OrderedDict()
        self.roots = 0
        self.chars = 0
        self.bound = bound


class PrefixIndex:
    """Block digests per node, bounded per node, in total and in nodes."""

    def __init__(
        self,
        nodeChars: int = NODE_CHARS,
        maxTotal: int = MAX_TOTAL,
        maxNodes: int = MAX_NODES,
    ) -> None:
        self.nodeChars = nodeChars
        self.maxTotal = maxTotal
        self.maxNodes = maxNodes
        self._nodes: OrderedDict[str, _NodeBlocks] = OrderedDict()
        self._where: dict[int, set[str]] = {}
        self._total = 0
        self._stamp = 0
        self.dropped = 0  # entries dropped as stale on a confirmed miss

    def __len__(self) -> int:
        return self._total

    def nodeCount(self) -> int:
        """How many nodes hold blocks."""
        return len(self._nodes)

    def nodeIds(self) -> list[str]:
        """The nodes holding blocks, sorted."""
        return sorted(self._nodes)

    def held(self, nodeId: str) -> int:
        """How many blocks ``nodeId`` holds."""
        node = self._nodes.get(nodeId)
        return 0 if node is None else len(node.blocks)

    def heldChars(self, nodeId: str) -> int:
        """How many characters of prompts the blocks ``nodeId`` holds stand for."""
        node = self._nodes.get(nodeId)
        return 0 if node is None else node.chars

    def bound(self, nodeId: str) -> int:
        """The most characters ``nodeId`` may hold."""
        node = self._nodes.get(nodeId)
        return self.nodeChars if node is None else node.bound

    def roots(self, nodeId: str) -> int:
        """How many distinct family blocks (prompt families: tenants) ``nodeId`` holds."""
        node = self._nodes.get(nodeId)
        return 0 if node is None else node.roots

    def setCapacity(self, nodeId: str, tokens: int) -> None:
        """The engine of ``nodeId`` reported room for ``tokens`` tokens of context: bound its
        characters to that (at least ``MIN_NODE_CHARS``, at most the default bound)."""
        bound = max(MIN_NODE_CHARS, min(self.nodeChars, tokens * CHARS_PER_TOKEN))
        node = self._nodes.get(nodeId)
        if node is None or node.bound == bound:
            return
        node.bound = bound
        while node.chars > bound:
            self._evict(nodeId, node)

    def matches(self, blocks: Sequence[int]) -> dict[str, int]:
        """Each node's longest matched prefix of ``blocks``, in blocks (nodes holding none
        are absent).  Only nodes holding the first block can match (a node's blocks of a
        prefix are always a leading part); each is searched by bisection."""
        if not blocks:
            return {}
        holders = self._where.get(blocks[0])
        if holders is None:
            return {}
        found: dict[str, int] = {}
        nodes = self._nodes
        for nodeId in holders:
            entries = nodes[nodeId].blocks
            low, high = 1, len(blocks)  # blocks[:low] held; blocks[:high + 1] not known
            while low < high:
                middle = (low + high + 1) // 2
                if blocks[middle - 1] in entries:
                    low = middle
                else:
                    high = middle - 1
            found[nodeId] = low
        return found

    def stampOf(self, nodeId: str, digest: int) -> int | None:
        """When (index stamp) ``nodeId`` last served the block ``digest``, if it holds it."""
        node = self._nodes.get(nodeId)
        entry = None if node is None else node.blocks.get(digest)
        return None if entry is None else entry[0]

    def record(
        self, nodeId: str, blocks: Sequence[int], ends: Sequence[int], root: int | None = 0
    ) -> int:
        """``nodeId`` served a prompt of ``blocks`` (block *i* ending at character
        ``ends[i]``; block ``root`` naming its family, if any) now; returns its stamp."""
        node = self._nodes.get(nodeId)
        if node is None:
            node = self._nodes[nodeId] = _NodeBlocks(self.nodeChars)
            while len(self._nodes) > self.maxNodes:
                oldId = next(iter(self._nodes))
                self._forget(oldId, self._nodes[oldId])
        else:
            self._nodes.move_to_end(nodeId)
        self._stamp += 1
        stamp = self._stamp
        entries = node.blocks
        where = self._where
        for position in range(min(len(blocks), len(ends)) - 1, -1, -1):  # deepest first
            digest = blocks[position]
            entry = entries.get(digest)
            if entry is not None:
                entries.move_to_end(digest)
                entries[digest] = (stamp, entry[1], entry[2])
                continue
            size = ends[position] - (ends[position - 1] if position else 0)
            self._total += 1
            node.chars += size
            owners = where.get(digest)
            if owners is None:
                where[digest] = {nodeId}
            else:
                owners.add(nodeId)
            isRoot = position == root
            if isRoot:
                node.roots += 1
            entries[digest] = (stamp, isRoot, size)
        while node.chars > node.bound and len(entries) > 1:
            self._evict(nodeId, node)
        while self._total > self.maxTotal:
            largestId, largest = max(self._nodes.items(), key=lambda item: len(item[1].blocks))
            self._evict(largestId, largest)
        return stamp

    def dropOlder(self, nodeId: str, stamp: int) -> int:
        """A confirmed miss: ``nodeId``'s engine no longer holds what it served at ``stamp``,
        so (its cache being LRU too) nothing it served no later than that either; drop those
        entries.  Returns how many went."""
        node = self._nodes.get(nodeId)
        dropped = 0
        while node is not None and node.blocks:
            _, (oldest, _, _) = next(iter(node.blocks.items()))
            if oldest > stamp:
                break
            self._evict(nodeId, node)
            dropped += 1
        self.dropped += dropped
        return dropped

    def forget(self, nodeId: str) -> None:
        """``nodeId`` left its fleet: drop its blocks."""
        node = self._nodes.get(nodeId)
        if node is not None:
            self._forget(nodeId, node)

    def _evict(self, nodeId: str, node: _NodeBlocks) -> None:
        digest, (_, root, size) = node.blocks.popitem(last=False)
        self._total -= 1
        node.chars -= size
        if root:
            node.roots -= 1
        owners = self._where.get(digest)
        if owners is not None:
            owners.discard(nodeId)
            if not owners:
                del self._where[digest]

    def _forget(self, nodeId: str, node: _NodeBlocks) -> None:
        while node.blocks:
            self._evict(nodeId, node)
        del self._nodes[nodeId]
