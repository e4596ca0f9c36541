"""The prefix index (spec §11.1): which node recently served which leading blocks of prompts.

A request's *prompt material* is written as one canonical text (chat messages in order, each
as its role and content; completion prompts after their system text; responses input after
its instructions) and cut in blocks of ``BLOCK_CHARS`` characters (no tokenizer needed).
Block *i*'s digest chains over every block before it, so two requests share block *i*'s
digest exactly when their first *i*+1 blocks are equal: a shared system prompt, a shared
document or an earlier turn all match by their leading blocks.  Only whole blocks count, at
most ``MAX_BLOCKS`` of them.

``PrefixIndex`` keeps, per node, the block digests it served most recently (an LRU bounded
by an estimate of what that engine can hold, ``NODE_BLOCKS`` by default) under a global bound
``MAX_TOTAL`` on (digest, node) pairs and ``MAX_NODES`` nodes, so its memory is constant under
any load.  A request's blocks are recorded deepest first, so a node's LRU always drops the
deepest blocks of a prefix before its leading ones and a node holding block *i* holds every
block before it.  Digests are Python's per-process keyed ``hash`` (never text).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["BLOCK_CHARS", "PrefixIndex", "blockDigests", "promptText"]

BLOCK_CHARS = 256  # characters of canonical text per block (about 64 tokens)
MAX_BLOCKS = 512  # blocks hashed per request, at most (128 Ki characters)
NODE_BLOCKS = 4096  # a node's default bound: 1 Mi characters (about 256 Ki tokens)
MIN_NODE_BLOCKS = 64  # the least a reported capacity sets a node's bound to
MAX_TOTAL = 1 << 18  # (digest, node) pairs over all nodes
MAX_NODES = 256  # nodes tracked; the least recently recorded goes beyond
CHARS_PER_TOKEN = 4  # how reported token capacities become characters

_ROLE_END, _MESSAGE_END = "\x1f", "\x1e"


def _messageText(message: object) -> str:
    if type(message) is dict and len(message) == 2:
        role = message.get("role")
        content = message.get("content")
        if type(role) is str and type(content) is str:
            return role + _ROLE_END + content + _MESSAGE_END
    text = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return text + _MESSAGE_END


def promptText(kind: str, doc: dict[str, object]) -> str | None:
    """The canonical prompt material of a request of ``kind`` (``chat``, ``prompt`` or
    ``responses``, as ``affinity.ROUTES`` names them) with body ``doc``, or None."""
    head = ""
    if kind == "responses":
        source = doc.get("input")
        instructions = doc.get("instructions")
        if type(instructions) is str:
            head = instructions + _MESSAGE_END
        if type(source) is str:
            return head + source
        messages = source
    elif kind == "chat":
        messages = doc.get("messages")
    else:
        prompt = doc.get("prompt")
        if type(prompt) is list and len(prompt) == 1:
            prompt = prompt[0]
        system = doc.get("system")
        if type(system) is str:
            head = system + _MESSAGE_END
        return head + prompt if type(prompt) is str else None
    if type(messages) is not list or not messages:
        return None
    return head + "".join([_messageText(m) for m in messages])


def blockDigests(seed: int, text: str) -> tuple[int, ...]:
    """The chained digests of ``text``'s whole blocks (at most ``MAX_BLOCKS``)."""
    count = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    digests: list[int] = []
    digest = seed
    for start in range(0, count * BLOCK_CHARS, BLOCK_CHARS):
        digest = hash((digest, text[start : start + BLOCK_CHARS]))
        digests.append(digest)
    return tuple(digests)


class _NodeBlocks:
    """One node's blocks, least recently served first: digest -> (stamp, is a first block)."""

    __slots__ = ("blocks", "roots", "bound")

    def __init__(self, bound: int) -> None:
        self.blocks: OrderedDict[int, tuple[int, bool]] = OrderedDict()
        self.roots = 0
        self.bound = bound


class PrefixIndex:
    """Block digests per node, bounded per node, in total and in nodes."""

    def __init__(
        self,
        nodeBlocks: int = NODE_BLOCKS,
        maxTotal: int = MAX_TOTAL,
        maxNodes: int = MAX_NODES,
    ) -> None:
        self.nodeBlocks = nodeBlocks
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

    def bound(self, nodeId: str) -> int:
        """The most blocks ``nodeId`` may hold."""
        node = self._nodes.get(nodeId)
        return self.nodeBlocks if node is None else node.bound

    def roots(self, nodeId: str) -> int:
        """How many distinct first blocks (prompt families: tenants) ``nodeId`` holds."""
        node = self._nodes.get(nodeId)
        return 0 if node is None else node.roots

    def setCapacity(self, nodeId: str, tokens: int) -> None:
        """The engine of ``nodeId`` reported room for ``tokens`` tokens of context: bound its
        blocks to that (at least ``MIN_NODE_BLOCKS``, at most the default bound)."""
        bound = max(MIN_NODE_BLOCKS, min(self.nodeBlocks, tokens * CHARS_PER_TOKEN // BLOCK_CHARS))
        node = self._nodes.get(nodeId)
        if node is None or node.bound == bound:
            return
        node.bound = bound
        while len(node.blocks) > bound:
            self._evict(nodeId, node)

    def matches(self, blocks: Sequence[int]) -> dict[str, int]:
        """Each node's longest matched prefix of ``blocks``, in blocks (nodes holding none
        are absent)."""
        where = self._where
        found: dict[str, int] = {}
        for position in range(len(blocks) - 1, -1, -1):
            nodes = where.get(blocks[position])
            if nodes is not None:
                for nodeId in nodes:
                    if nodeId not in found:
                        found[nodeId] = position + 1
                if len(found) == len(self._nodes):
                    break
        return found

    def stampOf(self, nodeId: str, digest: int) -> int | None:
        """When (index stamp) ``nodeId`` last served the block ``digest``, if it holds it."""
        node = self._nodes.get(nodeId)
        entry = None if node is None else node.blocks.get(digest)
        return None if entry is None else entry[0]

    def record(self, nodeId: str, blocks: Sequence[int]) -> int:
        """``nodeId`` served a prompt of ``blocks`` now; returns the stamp it got."""
        node = self._nodes.get(nodeId)
        if node is None:
            node = self._nodes[nodeId] = _NodeBlocks(self.nodeBlocks)
            while len(self._nodes) > self.maxNodes:
                oldId = next(iter(self._nodes))
                self._forget(oldId, self._nodes[oldId])
        else:
            self._nodes.move_to_end(nodeId)
        self._stamp += 1
        stamp = self._stamp
        entries = node.blocks
        where = self._where
        last = len(blocks) - 1
        for position in range(last, -1, -1):  # deepest first: leading blocks stay longest
            digest = blocks[position]
            if digest in entries:
                entries.move_to_end(digest)
            else:
                self._total += 1
                owners = where.get(digest)
                if owners is None:
                    where[digest] = {nodeId}
                else:
                    owners.add(nodeId)
                if position == 0:
                    node.roots += 1
            entries[digest] = (stamp, position == 0)
        while len(entries) > node.bound:
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
            _, (oldest, _) = next(iter(node.blocks.items()))
            if oldest > stamp:
                break
            self._evict(nodeId, node)
            dropped += 1
        self.dropped += dropped
        return dropped

    def retain(self, nodeIds: Iterable[str]) -> None:
        """Forget every node not in ``nodeIds`` (it left the fleet)."""
        keep = set(nodeIds)
        for nodeId in [n for n in self._nodes if n not in keep]:
            self._forget(nodeId, self._nodes[nodeId])

    def _evict(self, nodeId: str, node: _NodeBlocks) -> None:
        digest, (_, root) = node.blocks.popitem(last=False)
        self._total -= 1
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
