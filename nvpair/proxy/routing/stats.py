"""Per-request statistics measured from a response body as it streams (protocol §5).

The body is never buffered: :class:`StatsMeter` keeps a bounded tail window and counts stream
events with ``bytes.count`` as bytes leave it (and, at the end, in it); JSON is parsed only
once, at the end, and only inside the tail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

DIALECTS = ("ollama", "openai")

# A stream event starts a line: an SSE ``data:`` field, or an NDJSON object.  JSON text never
# holds a raw newline, so these patterns cannot match inside an event's payload.
_EVENT_PATTERNS = {"openai": b"\ndata:", "ollama": b"\n{"}

_USAGE_KEY = b'"usage"'
_TIMINGS_KEY = b'"timings"'
_EVAL_COUNT_KEY = b'"eval_count"'
_PROMPT_EVAL_COUNT_KEY = b'"prompt_eval_count"'
_EVAL_DURATION_KEY = b'"eval_duration"'
_MIN_TAIL = 8
_DONE_TRUE = re.compile(rb'"done"\s*:\s*true')
# The decoder's own scanner: one JSON value at an index (raw_decode without its wrapper).
_scan: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__


class StatsMeter:
    """Measures one committed response body as it streams, keeping only a bounded tail.

    ``dialect`` is ``"ollama"`` (native ``/api/*`` NDJSON or one JSON object) or ``"openai"``
    (SSE ``data:`` events or one JSON object).  Token counts come from the engine's usage
    report found in the tail (OpenAI ``usage``, Ollama ``eval_count``/``prompt_eval_count``);
    failing that, a body streamed as more than one event has its completion tokens counted
    from the events and flagged ``estimated``.  ``tokensPerSecond`` uses Ollama's
    ``eval_duration`` when reported, otherwise completion tokens over the streaming time
    (first byte to end) of a streamed body; a single non-streamed body has no meaningful
    streaming time, so it gets no throughput from the clock.  Choice: when no token count can
    be had but the first byte was seen, :meth:`result` still returns ``{"ttftMs": ...}``
    because time to first token is a real measurement; it returns ``None`` only when nothing
    at all was measured.
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
    )

    def __init__(self, dialect: str, createdAt: float, tailBytes: int = 8192) -> None:
        if dialect not in _EVENT_PATTERNS:
            raise ValueError(f"unknown dialect {dialect!r}")
        if tailBytes < 1:
            raise ValueError("tailBytes must be positive")
        self._dialect = dialect
        self._createdAt = createdAt
        self._pattern = _EVENT_PATTERNS[dialect]
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

    @property
    def retainedBytes(self) -> int:
        """How many body bytes the meter currently holds."""
        return len(self._tail)

    def firstByte(self, now: float) -> None:
        """Record the commit time (the first call wins)."""
        if self._firstByteAt is None:
            self._firstByteAt = now

    def feed(self, data: bytes) -> None:
        """Account for one body chunk: slide the tail, counting the events that leave it."""
        tail = self._tail
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

    def sawEnd(self) -> bool:
        """Whether the body seen so far ends with the dialect's end-of-answer event
        (SSE ``data: [DONE]``; an NDJSON line with ``"done": true``)."""
        tail = bytes(self._tail).rstrip()
        if self._dialect == "openai":
            return tail.endswith(b"[DONE]")
        last = tail.rsplit(b"\n", 1)[-1].replace(b" ", b"")
        return last.startswith(b"{") and b'"done":true' in last

    def result(self, now: float) -> dict[str, object] | None:
        """The protocol §5 stats of the body fed so far, or ``None`` if nothing was measured."""
        tail = bytes(self._tail)
        stats: dict[str, object] = {}
        prompt: int | None
        completion: int | None
        duration: float | None = None
        cached: int | None = None
        promptMs: float | None = None
        if self._dialect == "openai":
            prompt, completion, cached, promptMs = _openaiUsage(tail)
        else:
            prompt, completion, duration = _ollamaUsage(tail)
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
            if cached is not None and cached <= prompt:
                stats["cachedTokens"] = cached
            if promptMs is not None:
                stats["promptMs"] = promptMs
        firstByteAt = self._firstByteAt
        if completion is not None:
            stats["completionTokens"] = completion
            if duration is not None and duration > 0:
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
        if self._dialect == "openai":
            if last.startswith(b"data:") and last[5:].strip() == b"[DONE]":
                return 1
            return 0
        return 1 if _DONE_TRUE.search(last) else 0


def _valueAfter(tail: bytes, keyAt: int, key: bytes) -> object:
    """Decode the JSON value following the key at ``keyAt``, or return ``None``."""
    text = tail[keyAt + len(key) :].decode("utf-8", "replace").lstrip()
    if not text.startswith(":"):
        return None
    text = text[1:].lstrip()
    try:
        return _scan(text, 0)[0]
    except (StopIteration, ValueError, RecursionError):  # RecursionError: absurd nesting
        return None


def _count(value: object) -> int | None:
    """A token count if ``value`` is a non-negative integer (not a bool)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _openaiUsage(tail: bytes) -> tuple[int | None, int | None, int | None, float | None]:
    """The (prompt, completion, cached prompt) counts of the last ``usage`` object in the
    tail; cached from ``usage.prompt_tokens_details.cached_tokens``, else from llama.cpp's
    ``timings.cache_n`` (kept only when at most the prompt count, by ``result``); and
    llama.cpp's ``timings.prompt_ms`` (the prompt's evaluation, milliseconds) if reported.

    Inside a JSON string every quote is escaped, so ``"usage"`` with both quotes bare only
    ever matches a real key, even in a tail that starts in the middle of a string.
    """
    end = len(tail)
    while (at := tail.rfind(_USAGE_KEY, 0, end)) >= 0:
        end = at
        usage = _valueAfter(tail, at, _USAGE_KEY)
        if type(usage) is not dict:
            continue
        prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
        completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
        if prompt is not None or completion is not None:
            details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
            cached = _count(details.get("cached_tokens")) if type(details) is dict else None
            timings = _timings(tail)
            if cached is None:
                cached = _count(timings.get("cache_n"))
            return prompt, completion, cached, _milliseconds(timings.get("prompt_ms"))
    return None, None, None, None


def _timings(tail: bytes) -> dict[str, object]:
    """llama.cpp's last ``timings`` object in the tail (empty when there is none)."""
    at = tail.rfind(_TIMINGS_KEY)
    if at < 0:
        return {}
    timings = _valueAfter(tail, at, _TIMINGS_KEY)
    return timings if type(timings) is dict else {}


def _milliseconds(value: object) -> float | None:
    """A finite, non-negative duration in milliseconds (rounded to µs), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e12:
        return round(float(value), 3)
    return None


def _ollamaUsage(tail: bytes) -> tuple[int | None, int | None, float | None]:
    """The (prompt, completion, eval duration ns) of the last Ollama object reporting counts."""
    at = max(tail.rfind(_EVAL_COUNT_KEY), tail.rfind(_PROMPT_EVAL_COUNT_KEY))
    if at < 0:
        return None, None, None
    # The reporting object runs from the last line starting an object before the key (or
    # the tail's start, when the object is longer than the tail) to the next such line.
    objectStart = tail.rfind(b"\n{", 0, at) + 1
    objectEnd = tail.find(b"\n{", at)
    region = tail[objectStart:] if objectEnd < 0 else tail[objectStart:objectEnd]
    fields: dict[str, object] = {}
    for name, key in (
        ("eval_count", _EVAL_COUNT_KEY),
        ("prompt_eval_count", _PROMPT_EVAL_COUNT_KEY),
        ("eval_duration", _EVAL_DURATION_KEY),
    ):
        keyAt = region.rfind(key)
        if keyAt >= 0:
            fields[name] = _valueAfter(region, keyAt, key)
    prompt = _count(fields.get("prompt_eval_count"))
    completion = _count(fields.get("eval_count"))
    rawDuration = fields.get("eval_duration")
    duration: float | None = None
    if isinstance(rawDuration, int | float) and not isinstance(rawDuration, bool):
        duration = float(rawDuration)
    if completion is None:
        duration = None
    return prompt, completion, duration
