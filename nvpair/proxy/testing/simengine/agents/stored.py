"""The responses a stateful engine (LM Studio) produced, by id: a bounded table (spec §16)."""

from __future__ import annotations

from collections import OrderedDict

MAX_STORED = 1024
"""How many responses are kept; past it the least recently used is forgotten."""


class StoredResponses:
    """Response id -> the conversation it ended with (its prompt's tokens and its answer's,
    space-joined), least recently used forgotten first."""

    def __init__(self, capacity: int = MAX_STORED) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, responseId: str, words: list[str]) -> None:
        """Keep the conversation ``responseId`` ended with."""
        entries = self._entries
        entries[responseId] = " ".join(words)
        entries.move_to_end(responseId)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def conversation(self, responseId: str) -> list[str] | None:
        """The tokens of the conversation ``responseId`` ended with, or None if unknown."""
        text = self._entries.get(responseId)
        if text is None:
            return None
        self._entries.move_to_end(responseId)
        return text.split()
