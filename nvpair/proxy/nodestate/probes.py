"""Parsers of the engines' own state endpoints (spec §10, §11.2): pure, fed by the network.

Each parser takes the body of one probe answer and returns an ``EngineReport`` or raises
``BadProbe`` (malformed JSON, wrong types, over ``MAX_PROBE_BYTES``, missing fields): a probe
that cannot be read says nothing, so its node's state is *unknown*, never idle.

* llama.cpp ``GET /slots``: a list of slots, each ``{id, n_ctx, is_processing}`` (older
  servers: ``state``, 0 idle); busy is the processing ones, total the list's length.
* llama.cpp ``GET /metrics`` (servers without ``/slots``): ``llamacpp:requests_processing``
  is busy; the total is unknown, except that requests waiting (``requests_deferred`` > 0)
  means every slot is busy (total = busy).
* LM Studio ``GET /api/v0/models``: ``{data: [{id, state}]}``; loaded models only.
* Ollama ``GET /api/ps``: ``{models: [{name|model, expires_at}]}``; loaded models only.
"""

from __future__ import annotations

import json
import math
import re

import attrs

__all__ = ["MAX_PROBE_BYTES", "BadProbe", "EngineReport", "parseProbe"]

MAX_PROBE_BYTES = 1 << 20
MAX_SLOTS = 4096
MAX_MODELS = 4096
MAX_NAME = 512


class BadProbe(ValueError):
    """A probe answer that cannot be read (the message names the problem, never the body)."""


@attrs.frozen
class EngineReport:
    """What one probe says of an engine: slots busy and total (None: not said), the context
    its slots hold in tokens, and the models it has loaded (None: not said)."""

    busy: int | None = None
    total: int | None = None
    contextTokens: int | None = None
    loaded: frozenset[str] | None = None
    expires: tuple[tuple[str, str], ...] = ()  # (model, until) where the engine says


def _json(body: bytes) -> object:
    if len(body) > MAX_PROBE_BYTES:
        raise BadProbe("answer too large")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadProbe("not JSON") from e


def _count(value: object) -> int | None:
    if type(value) is int and 0 <= value < 1 << 40:
        return value
    return None


def parseSlots(body: bytes) -> EngineReport:
    """llama.cpp ``GET /slots``."""
    doc = _json(body)
    if type(doc) is not list or not doc or len(doc) > MAX_SLOTS:
        raise BadProbe("slots: expected a non-empty list")
    busy = 0
    context = 0
    for slot in doc:
        if type(slot) is not dict:
            raise BadProbe("slots: expected objects")
        processing = slot.get("is_processing")
        if processing is None:
            state = _count(slot.get("state"))
            if state is None:
                raise BadProbe("slots: no is_processing nor state")
            processing = state != 0
        if type(processing) is not bool:
            raise BadProbe("slots: is_processing not a boolean")
        busy += processing
        context += _count(slot.get("n_ctx")) or 0
    return EngineReport(busy=busy, total=len(doc), contextTokens=context or None)


_METRIC = re.compile(rb"^llamacpp:(requests_processing|requests_deferred)(?:\{[^}\n]*\})? +(\S+)")


def parseMetrics(body: bytes) -> EngineReport:
    """llama.cpp ``GET /metrics`` (Prometheus text)."""
    if len(body) > MAX_PROBE_BYTES:
        raise BadProbe("answer too large")
    values: dict[bytes, int] = {}
    for line in body.split(b"\n"):
        match = _METRIC.match(line)
        if match is None:
            continue
        try:
            number = float(match.group(2))
        except ValueError as e:
            raise BadProbe("metrics: not a number") from e
        if not math.isfinite(number) or number < 0 or number >= 1 << 40:
            raise BadProbe("metrics: out of range")
        values[match.group(1)] = int(number)
    busy = values.get(b"requests_processing")
    if busy is None:
        raise BadProbe("metrics: no requests_processing")
    deferred = values.get(b"requests_deferred", 0)
    return EngineReport(busy=busy, total=busy if deferred > 0 else None)


def _name(value: object) -> str | None:
    return value if type(value) is str and 0 < len(value) <= MAX_NAME else None


def _entries(doc: object, field: str) -> list[object]:
    if type(doc) is not dict:
        raise BadProbe(f"{field}: expected an object")
    entries = doc.get(field)
    if type(entries) is not list or len(entries) > MAX_MODELS:
        raise BadProbe(f"{field}: expected a list")
    return entries


def parseLmStudioModels(body: bytes) -> EngineReport:
    """LM Studio ``GET /api/v0/models``."""
    loaded: set[str] = set()
    for entry in _entries(_json(body), "data"):
        if type(entry) is not dict:
            raise BadProbe("data: expected objects")
        name = _name(entry.get("id"))
        state = entry.get("state")
        if name is None or type(state) is not str:
            raise BadProbe("data: id and state expected")
        if state == "loaded":
            loaded.add(name)
    return EngineReport(loaded=frozenset(loaded))


def parseOllamaPs(body: bytes) -> EngineReport:
    """Ollama ``GET /api/ps``."""
    loaded: set[str] = set()
    expires: list[tuple[str, str]] = []
    for entry in _entries(_json(body), "models"):
        if type(entry) is not dict:
            raise BadProbe("models: expected objects")
        name = _name(entry.get("model")) or _name(entry.get("name"))
        if name is None:
            raise BadProbe("models: model name expected")
        loaded.add(name)
        until = entry.get("expires_at")
        if type(until) is str and len(until) <= 64:
            expires.append((name, until))
    return EngineReport(loaded=frozenset(loaded), expires=tuple(sorted(expires)))


PARSERS = {
    b"/slots": parseSlots,
    b"/metrics": parseMetrics,
    b"/api/v0/models": parseLmStudioModels,
    b"/api/ps": parseOllamaPs,
}


def parseProbe(path: bytes, body: bytes) -> EngineReport:
    """The report of a 2xx answer to the probe ``path``; ``BadProbe`` when unreadable."""
    parser = PARSERS.get(path)
    if parser is None:
        raise BadProbe("no parser for this probe")
    return parser(body)
