"""Per-request statistics measured from a response body as it streams (protocol §5).

The body is never buffered: :class:`StatsMeter` keeps a bounded tail window and counts stream
events with ``bytes.count`` as bytes leave it (and, at the end, in it); JSON is parsed only
once, at the end, and only inside the tail.  A stream whose usage comes at its start
(Anthropic's ``message_start``) also has its first bytes looked at, at most ``HEAD_BYTES``
of them and only until that event's line is complete.  What each dialect's usage report
says, and the bounds on every number in it, are ``usage``'s.
"""

from __future__ import annotations

import re

from nvpair.proxy.routing.usage import (
    DIALECTS,
    AnthropicUsage,
    Usage,
    anthropicStart,
    anthropicTail,
    ollamaUsage,
    openaiUsage,
)

HEAD_BYTES = 4096
"""How much of a stream's start is looked at for its start event's usage."""
_MIN_TAIL = 32
_DONE_TRUE = re.compile(rb'"done"\s*:\s*true')
_SSE_ENDS = (b"\n\n", b"\r\n\r\n")


class StatsMeter:
    """Measures one committed response body as it streams, keeping only a bounded tail.

    ``dialect`` names one of ``usage.DIALECTS``: ``"ollama"`` (native ``/api/*`` NDJSON or
    one JSON object), ``"openai"`` (SSE ``data:`` events or one JSON object), ``"anthropic"``
    (Messages) or ``"responses"`` (``"responses-uncached"``) with their named SSE events.
    Token counts come from the engine's usage report (``usage``); failing that, a body
    streamed as more than one event has its completion tokens counted from the events and
    flagged ``estimated``.  ``tokensPerSecond`` uses Ollama's ``eval_duration`` when
    reported, otherwise completion tokens over the streaming time (first byte to end) of a
    streamed body; a single non-streamed body has no meaningful streaming time, so it gets
    no throughput from the clock.  Choice: when no token count can be had but the first byte
    was seen, :meth:`result` still returns ``{"ttftMs": ...}`` because time to first token
    is a real measurement; it returns ``None`` only when nothing at all was measured.
    """

    __slots__ = (
        "_dialect",
        "_createdAt",
        "_tailBytes",
        "_tail",
        "_pattern",
        "_keep",
        "_events",
        "_firstByteAt",
        "_head",
        "_start",
        "_endMarker",
        "_ended",
    )

    def __init__(self, dialect: str, createdAt: float, tailBytes: int = 8192) -> None:
        kind = DIALECTS.get(dialect)
        if kind is None:
            raise ValueError(f"unknown dialect {dialect!r}")
        if tailBytes < 1:
            raise ValueError("tailBytes must be positive")
        self._dialect = kind
        self._createdAt = createdAt
        self._pattern = kind.event
        self._keep = len(self._pattern) - 1
        # At least one whole event marker's worth, so that a marker cut by a chunk boundary
        # is never evicted before its end arrives.
        self._tailBytes = max(tailBytes, _MIN_TAIL)
        # The tail starts with a newline the body does not have (it is the first byte to be
        # evicted) so that an event on the body's first line counts.  Events are counted
        # as bytes leave the tail (``_events``) plus those still in it.
        self._tail = bytearray(b"\n")
        self._events = 0
        self._firstByteAt: float | None = None
        # The stream's first bytes, while its start event's usage is looked for.
        self._head: bytearray | None = bytearray() if kind.startEvent else None
        self._start: AnthropicUsage | None = None
        self._endMarker = b"\nevent: " + kind.endEvent if kind.endEvent else b""
        self._ended = False

    @property
    def retainedBytes(self) -> int:
        """How many body bytes the meter currently holds."""
        head = self._head
        return len(self._tail) + (0 if head is None else len(head))

    def firstByte(self, now: float) -> None:
        """Record the commit time (the first call wins)."""
        if self._firstByteAt is None:
            self._firstByteAt = now

    def feed(self, data: bytes) -> None:
        """Account for one body chunk: slide the tail, counting the events that leave it."""
        if self._head is not None:
            self._lookAtStart(data)
        tail = self._tail
        marker = self._endMarker
        if marker and not self._ended:
            keep = len(marker) - 1
            if marker in data or marker in bytes(tail[-keep:]) + data[:keep]:
                self._ended = True
        limit = self._tailBytes
        if len(data) >= limit:
            self._events += (tail + data[: self._keep]).count(self._pattern) + data.count(
                self._pattern, 0, len(data) - limit + self._keep
            )
            self._tail = bytearray(memoryview(data)[-limit:])
            return
        tail += data
        excess = len(tail) - limit
        if excess > 0:
            # The events starting in the evicted bytes: a marker starting there ends within
            # ``keep`` bytes after them (and has arrived whole, as the tail is longer).
            self._events += tail.count(self._pattern, 0, excess + self._keep)
            del tail[:excess]

    def _lookAtStart(self, data: bytes) -> None:
        """Look for the start event's ``data:`` line in the stream's first ``HEAD_BYTES``;
        read its usage once the line is whole, then stop looking."""
        head = self._head
        assert head is not None
        head += data[: HEAD_BYTES - len(head)]
        if head.lstrip()[:1] == b"{":
            self._head = None  # one JSON document, not a stream: its usage is in the tail
            return
        name = self._dialect.startEvent
        at = 0
        while (at := head.find(name, at)) >= 0:
            lineEnd = head.find(b"\n", at)
            if lineEnd < 0:
                break  # that line is not whole yet
            found = anthropicStart(bytes(head[head.rfind(b"\n", 0, at) + 1 : lineEnd]))
            if found is not None:
                self._start = found
                self._head = None
                return
            at = lineEnd
        if len(head) >= HEAD_BYTES:
            self._head = None  # not within the stream's start: its usage is not read

    def sawEnd(self) -> bool:
        """Whether the body seen so far ends with the dialect's end-of-answer event
        (SSE ``data: [DONE]``; an NDJSON line with ``"done": true``; a whole
        ``message_stop`` or ``response.completed`` event)."""
        if self._endMarker:
            return self._ended and bytes(self._tail).endswith(_SSE_ENDS)
        tail = bytes(self._tail).rstrip()
        if self._dialect.name == "openai":
            return tail.endswith(b"[DONE]")
        last = tail.rsplit(b"\n", 1)[-1].replace(b" ", b"")
        return last.startswith(b"{") and b'"done":true' in last

    def _usage(self, tail: bytes) -> Usage:
        name = self._dialect.name
        if name == "ollama":
            return ollamaUsage(tail)
        if name == "anthropic":
            start, end = self._start, anthropicTail(tail)
            if end is None:
                return Usage() if start is None else start.usage()
            return end.usage() if start is None else start.then(end).usage()
        return openaiUsage(tail, self._dialect.cachedIsCounted)

    def result(self, now: float) -> dict[str, object] | None:
        """The protocol §5 stats of the body fed so far, or ``None`` if nothing was measured."""
        tail = bytes(self._tail)
        stats: dict[str, object] = {}
        usage = self._usage(tail)
        prompt, completion = usage.prompt, usage.completion
        # Events are those counted as they left the tail plus those still in it; only an
        # estimate needs their exact number, otherwise only whether there were two or more.
        pattern = self._pattern
        events = self._events
        estimated = False
        if prompt is None and completion is None:
            events += tail.count(pattern)
            if events > 1:
                completion = events - self._trailerEvents(tail)
                estimated = True
        elif events < 2:
            at = tail.find(pattern)
            if at >= 0 and (events or tail.find(pattern, at + 1) >= 0):
                events = 2
        if prompt is not None:
            stats["promptTokens"] = prompt
            cached = usage.cached
            if cached is not None and cached <= prompt:
                stats["cachedTokens"] = cached
            if usage.promptMs is not None:
                stats["promptMs"] = usage.promptMs
        if usage.loadNs is not None:
            stats["loadMs"] = round(usage.loadNs / 1e6, 3)
        firstByteAt = self._firstByteAt
        if completion is not None:
            stats["completionTokens"] = completion
            duration = usage.durationNs
            if duration is not None and duration >= 1:
                stats["tokensPerSecond"] = round(completion / (duration / 1e9), 2)
            elif events > 1 and firstByteAt is not None and now > firstByteAt:
                stats["tokensPerSecond"] = round(completion / (now - firstByteAt), 2)
        if firstByteAt is not None:
            stats["ttftMs"] = max(0, round((firstByteAt - self._createdAt) * 1000))
        if estimated:
            stats["estimated"] = True
        return stats or None

    def _trailerEvents(self, tail: bytes) -> int:
        """How many of the counted events are trailers rather than content (0 or 1)."""
        lines = tail.rstrip().rsplit(b"\n", 1)
        last = lines[-1].strip()
        name = self._dialect.name
        if name == "openai":
            if last.startswith(b"data:") and last[5:].strip() == b"[DONE]":
                return 1
            return 0
        if name == "ollama":
            return 1 if _DONE_TRUE.search(last) else 0
        return 0  # the named-event streams count content deltas only
