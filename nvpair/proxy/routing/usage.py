"""What an engine says a request cost, read from a bounded piece of its answer (protocol §5,
spec §8): each dialect's usage report, and the bounds every reported number is held to.

Pure functions of bytes the statistics meter (``stats.StatsMeter``) keeps: the tail of a
body, or one line from the start of a stream.  Every number an engine reports is bounded as
the probe parsers bound theirs: a count is an integer in ``[0, 2**40)``, a duration finite,
non-negative and bounded; anything else counts as not reported, so that no answer (say one
claiming ``10**400`` prompt tokens) can reach the workload events, ``/metrics`` or the page.

The dialects (``DIALECTS``):

* ``openai``: chat and completions (SSE ``data:`` events or one JSON document):
  ``usage.prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``,
  else llama.cpp's ``timings.cache_n``; llama.cpp's ``timings.prompt_ms``;
* ``ollama``: Ollama's native NDJSON or JSON: ``prompt_eval_count``, ``eval_count``,
  ``eval_duration``;
* ``anthropic``: Messages (one JSON document, or SSE events ``message_start`` ...
  ``message_stop``): ``usage.input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``; a stream carries the input usage in ``message_start``
  (read from the stream's first 4 KiB) and the output in ``message_delta`` (the tail), a
  later value winning; the prompt is input + cache read + cache creation (Anthropic's
  ``input_tokens`` leaves the cached part out), the cached part the cache read;
* ``responses``: OpenAI Responses (one JSON document, or SSE events ``response.created`` ...
  ``response.completed``, whose ``response.usage`` the tail holds): ``usage.input_tokens``,
  ``output_tokens``, ``input_tokens_details.cached_tokens``, llama.cpp's ``timings``;
* ``responses-uncached``: the same, its cached count ignored (Ollama's is a constant 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import attrs

MAX_COUNT = 1 << 40
"""A token count at or above this is not a count (no request is a trillion tokens)."""
MAX_MILLISECONDS = 1e12
MAX_NANOSECONDS = float(1 << 63)

USAGE_KEY = b'"usage"'
TIMINGS_KEY = b'"timings"'
EVAL_COUNT_KEY = b'"eval_count"'
PROMPT_EVAL_COUNT_KEY = b'"prompt_eval_count"'
EVAL_DURATION_KEY = b'"eval_duration"'
LOAD_DURATION_KEY = b'"load_duration"'

# The decoder's own scanner: one JSON value at an index (raw_decode without its wrapper).
_scan: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__


@attrs.frozen
class Dialect:
    """How one dialect's answers are measured: the stream event counted for an estimate,
    the named SSE event that ends a stream (empty: none), the event at a stream's start that
    carries usage (empty: none), and whether its cached count is one."""

    name: str
    event: bytes
    endEvent: bytes = b""
    startEvent: bytes = b""
    cachedIsCounted: bool = True


# A stream event starts a line: an SSE ``data:`` field, or an NDJSON object.  JSON text never
# holds a raw newline, so these patterns cannot match inside an event's payload.  The named
# event streams count their content deltas (``event: content_block_delta``, ``event:
# response.output_text.delta`` and the other ``*.delta`` events).
DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        Dialect("openai", b"\ndata:"),
        Dialect("ollama", b"\n{"),
        Dialect(
            "anthropic",
            b"content_block_delta\ndata:",
            endEvent=b"message_stop",
            startEvent=b"message_start",
        ),
        Dialect("responses", b"delta\ndata:", endEvent=b"response.completed"),
        Dialect(
            "responses-uncached",
            b"delta\ndata:",
            endEvent=b"response.completed",
            cachedIsCounted=False,
        ),
    )
}


@attrs.frozen
class Usage:
    """What an answer reported: prompt, completion and cached prompt tokens, the prompt's
    evaluation in milliseconds (llama.cpp), the generation and the wait for the model to
    load in nanoseconds (Ollama)."""

    prompt: int | None = None
    completion: int | None = None
    cached: int | None = None
    promptMs: float | None = None
    durationNs: float | None = None
    loadNs: float | None = None


NOTHING = Usage()


INVALID = -1
"""An Anthropic count that was reported but is not a count (kept apart from "not reported",
so that an absurd part spoils the sum rather than dropping out of it)."""


@attrs.frozen
class AnthropicUsage:
    """One Anthropic ``usage`` object's counts (None where it did not say, ``INVALID``
    where it said something that is not a count)."""

    input: int | None = None
    output: int | None = None
    cacheRead: int | None = None
    cacheCreation: int | None = None

    def then(self, later: AnthropicUsage) -> AnthropicUsage:
        """These counts updated by a later report (``message_delta`` after ``message_start``)."""
        return AnthropicUsage(
            later.input if later.input is not None else self.input,
            later.output if later.output is not None else self.output,
            later.cacheRead if later.cacheRead is not None else self.cacheRead,
            later.cacheCreation if later.cacheCreation is not None else self.cacheCreation,
        )

    def usage(self) -> Usage:
        """As our statistics: the prompt is input + cache read + cache creation (absent when
        none was reported, or when one of them, or their sum, is not a count)."""
        parts = [p for p in (self.input, self.cacheRead, self.cacheCreation) if p is not None]
        prompt = count(sum(parts)) if parts and INVALID not in parts else None
        output = None if self.output == INVALID else self.output
        cached = self.cacheRead if prompt is not None else None
        return Usage(prompt, output, cached)


def count(value: object) -> int | None:
    """A token count: an integer (not a bool) in ``[0, MAX_COUNT)``, else None."""
    if type(value) is int and 0 <= value < MAX_COUNT:
        return value
    return None


def milliseconds(value: object) -> float | None:
    """A finite duration in ``[0, 1e12)`` milliseconds (rounded to µs), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if 0 <= value < MAX_MILLISECONDS:  # False for NaN
            return round(float(value), 3)
    return None


def nanoseconds(value: object) -> float | None:
    """A finite duration in ``[0, 2**63)`` nanoseconds (Go's ``time.Duration``), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if 0 <= value < MAX_NANOSECONDS and math.isfinite(value):
            return float(value)
    return None


def valueAfter(tail: bytes, keyAt: int, key: bytes) -> object:
    """Decode the JSON value following the key at ``keyAt``, or return ``None``."""
    text = tail[keyAt + len(key) :].decode("utf-8", "replace").lstrip()
    if not text.startswith(":"):
        return None
    text = text[1:].lstrip()
    try:
        return _scan(text, 0)[0]
    except (StopIteration, ValueError, RecursionError):  # RecursionError: absurd nesting
        return None


def lastUsage(tail: bytes, keys: tuple[str, ...]) -> dict[str, object] | None:
    """The last ``usage`` object in the tail that has one of ``keys``.

    Inside a JSON string every quote is escaped, so ``"usage"`` with both quotes bare only
    ever matches a real key, even in a tail that starts in the middle of a string.
    """
    end = len(tail)
    while (at := tail.rfind(USAGE_KEY, 0, end)) >= 0:
        end = at
        usage = valueAfter(tail, at, USAGE_KEY)
        if type(usage) is dict and not usage.keys().isdisjoint(keys):
            return usage
    return None


_OPENAI_KEYS = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
_ANTHROPIC_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def openaiUsage(tail: bytes, cachedIsCounted: bool = True) -> Usage:
    """The counts of the last OpenAI ``usage`` object in the tail (chat and completions'
    ``prompt_tokens``/``completion_tokens``, Responses' ``input_tokens``/``output_tokens``);
    cached from ``prompt_tokens_details`` (``input_tokens_details``) ``.cached_tokens``, else
    llama.cpp's ``timings.cache_n``; and llama.cpp's ``timings.prompt_ms``."""
    usage = lastUsage(tail, _OPENAI_KEYS)
    if usage is None:
        return NOTHING
    prompt = count(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = count(usage.get("completion_tokens", usage.get("output_tokens")))
    if prompt is None and completion is None:
        return NOTHING
    timings = lastTimings(tail)
    cached = None
    if cachedIsCounted:
        details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
        cached = count(details.get("cached_tokens")) if type(details) is dict else None
        if cached is None and timings:
            cached = count(timings.get("cache_n"))
    promptMs = milliseconds(timings.get("prompt_ms")) if timings else None  # not llama.cpp
    return Usage(prompt, completion, cached, promptMs)


def lastTimings(tail: bytes) -> dict[str, object]:
    """llama.cpp's last ``timings`` object in the tail (empty when there is none)."""
    at = tail.rfind(TIMINGS_KEY)
    if at < 0:
        return {}
    timings = valueAfter(tail, at, TIMINGS_KEY)
    return timings if type(timings) is dict else {}


def anthropicCounts(usage: dict[str, object]) -> AnthropicUsage:
    """One Anthropic ``usage`` object's counts (``INVALID`` for one that is not a count)."""

    def field(name: str) -> int | None:
        if name not in usage or usage[name] is None:
            return None
        value = count(usage[name])
        return INVALID if value is None else value

    return AnthropicUsage(
        field("input_tokens"),
        field("output_tokens"),
        field("cache_read_input_tokens"),
        field("cache_creation_input_tokens"),
    )


def anthropicTail(tail: bytes) -> AnthropicUsage | None:
    """The counts of the last Anthropic ``usage`` object in the tail (a non-streamed
    answer's, or a stream's ``message_delta``), or None."""
    usage = lastUsage(tail, _ANTHROPIC_KEYS)
    return None if usage is None else anthropicCounts(usage)


def anthropicStart(line: bytes) -> AnthropicUsage | None:
    """The input usage of a stream's ``message_start`` event, from its ``data:`` line; None
    when the line is not that event's."""
    if not line.startswith(b"data:"):
        return None
    try:
        doc = json.loads(line[5:])
    except (ValueError, RecursionError):
        return None
    if type(doc) is not dict or doc.get("type") != "message_start":
        return None
    message = doc.get("message")
    usage = message.get("usage") if type(message) is dict else None
    return anthropicCounts(usage) if type(usage) is dict else AnthropicUsage()


def ollamaUsage(tail: bytes) -> Usage:
    """The prompt, completion and eval duration of the last Ollama object reporting counts."""
    at = max(tail.rfind(EVAL_COUNT_KEY), tail.rfind(PROMPT_EVAL_COUNT_KEY))
    if at < 0:
        return NOTHING
    # The reporting object runs from the last line starting an object before the key (or
    # the tail's start, when the object is longer than the tail) to the next such line.
    objectStart = tail.rfind(b"\n{", 0, at) + 1
    objectEnd = tail.find(b"\n{", at)
    region = tail[objectStart:] if objectEnd < 0 else tail[objectStart:objectEnd]
    fields: dict[bytes, object] = {}
    for key in (EVAL_COUNT_KEY, PROMPT_EVAL_COUNT_KEY, EVAL_DURATION_KEY, LOAD_DURATION_KEY):
        keyAt = region.rfind(key)
        if keyAt >= 0:
            fields[key] = valueAfter(region, keyAt, key)
    completion = count(fields.get(EVAL_COUNT_KEY))
    duration = nanoseconds(fields.get(EVAL_DURATION_KEY)) if completion is not None else None
    return Usage(
        count(fields.get(PROMPT_EVAL_COUNT_KEY)),
        completion,
        durationNs=duration,
        loadNs=nanoseconds(fields.get(LOAD_DURATION_KEY)),
    )
