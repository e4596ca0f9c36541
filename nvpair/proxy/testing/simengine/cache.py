"""The simulated engine's prefix cache: an LRU of token-block digests, bounded by capacity.

Like vLLM's automatic prefix caching (and llama.cpp's prompt cache): a request's prompt is
cut into blocks, each known by its chained digest (``tokens.blockDigests``); the leading
blocks already held are served from cache, the rest are computed and then held. When full,
the least recently used block goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """An LRU set of block digests holding at most ``capacityBlocks`` blocks."""

    def __init__(self, capacityBlocks: int) -> None:
        if capacityBlocks < 0:
            raise ValueError("the cache capacity cannot be negative")
        self.capacityBlocks = capacityBlocks
        self.evictions = 0
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._blocks

    def match(self, digests: Sequence[bytes]) -> int:
        """How many leading blocks of ``digests`` are held; those become most recently used."""
        blocks = self._blocks
        n = 0
        for digest in digests:
            if digest not in blocks:
                break
            blocks.move_to_end(digest)
            n += 1
        return n

    def insert(self, digests: Sequence[bytes]) -> None:
        """Hold ``digests`` (most recently used), evicting the least recently used past capacity.

        A prompt longer than the whole cache keeps its last blocks, as an LRU would.
        """
        blocks = self._blocks
        for digest in digests:
            if digest in blocks:
                blocks.move_to_end(digest)
            else:
                blocks[digest] = None
        while len(blocks) > self.capacityBlocks:
            blocks.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        """Drop every block (the engine restarted or unloaded its model)."""
        self._blocks.clear()
