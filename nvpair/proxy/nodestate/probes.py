"""Parsers of the engines' own state endpoints (spec §10, §11.2): pure, fed by the network.

Each parser takes the body of one probe answer and returns an ``EngineReport`` or raises
``BadProbe`` (malformed JSON, wrong types, over ``MAX_PROBE_BYTES``, missing fields): a probe
that cannot be read says nothing, so its node's state is *unknown*, never idle.

* llama.cpp ``GET /slots``: a list of slots, each ``{id, n_ctx, is_processing}`` (older
  servers: ``state``, 0 idle); busy is the processing ones, total the list's length.
* llama.cpp ``GET /metrics`` (servers without ``/slots``): ``llamacpp:requests_processing``
  is busy; the total is unknown, except that requests waiting (``requests_deferred`` > 0)
  means every slot is busy (total = busy).
* LM Studio ``GET /api/v1/models`` (its v1 REST API, 0.4 and later): ``{models: [{key,
  size_bytes, loaded_instances: [{id, config: {context_length, parallel}}]}]}``: every
  installed model, loaded when it has an instance; ``GET /api/v0/models`` (older servers):
  ``{data: [{id, state}]}``, ``state`` ``loaded`` or ``not-loaded``.
* Ollama ``GET /api/ps``: ``{models: [{name|model, size, size_vram, expires_at,
  context_length}]}``: the models resident (a model still loading is listed too).
* llama.cpp in router mode (``llama-server`` without ``-m``) ``GET /models``: ``{data: [{id,
  status: {value}}]}``, every installed model with ``unloaded``, ``loading``, ``loaded``,
  ``sleeping``, ...; a list without statuses is a single-model server (``NotThisProbe``).
  The per-model ``/slots?model=NAME&autoload=false`` of each loaded model are read with
  ``parseSlots`` and folded in by ``withChildSlots``.
"""

from __future__ import annotations

import json
import math
import re

import attrs

__all__ = [
    "MAX_PROBE_BYTES",
    "BadProbe",
    "EngineReport",
    "NotThisProbe",
    "ResidentModel",
    "parseIdentity",
    "parseProbe",
]

MAX_PROBE_BYTES = 1 << 20
MAX_SLOTS = 4096
MAX_MODELS = 4096
MAX_NAME = 512


class BadProbe(ValueError):
    """A probe answer that cannot be read (the message names the problem, never the body)."""


class NotThisProbe(BadProbe):
    """A readable answer that is not this probe's kind of server (a single-model llama.cpp
    answering the router's ``/models``): the poller moves on to the engine's next probe."""


LOADED = "loaded"
LOADING = "loading"
SLEEPING = "sleeping"


@attrs.frozen
class ResidentModel:
    """One model an engine holds in memory (or is loading), as its probe says: its state
    (``loaded``, ``loading``, ``sleeping``) and what the engine tells of it (None: not
    said): sizes in bytes, when it unloads (``expires_at``, RFC 3339), its LM Studio instance
    id, its context, its parallel slots, and (router mode) its child's slots."""

    name: str
    state: str = LOADED
    sizeBytes: int | None = None
    vramBytes: int | None = None
    until: str | None = None
    instance: str | None = None
    contextTokens: int | None = None
    parallel: int | None = None
    busy: int | None = None
    total: int | None = None


@attrs.frozen
class EngineReport:
    """What one probe says of an engine: slots busy and total (None: not said), the context
    its slots hold in tokens, and the models it has loaded (None: not said); where the
    engine says more, every model it holds or is loading (``resident``), every model it has
    installed (``installed``) and whether it is a llama.cpp router (``router``)."""

    busy: int | None = None
    total: int | None = None
    contextTokens: int | None = None
    loaded: frozenset[str] | None = None
    expires: tuple[tuple[str, str], ...] = ()  # (model, until) where the engine says
    resident: tuple[ResidentModel, ...] | None = None
    installed: frozenset[str] | None = None
    router: bool = False


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


def _size(value: object) -> int | None:
    if type(value) is int and 0 <= value < 1 << 62:
        return value
    return None


def _until(value: object) -> str | None:
    return value if type(value) is str and 0 < len(value) <= 64 else None


def parseLmStudioModels(body: bytes) -> EngineReport:
    """LM Studio ``GET /api/v0/models``."""
    loaded: set[str] = set()
    installed: set[str] = set()
    for entry in _entries(_json(body), "data"):
        if type(entry) is not dict:
            raise BadProbe("data: expected objects")
        name = _name(entry.get("id"))
        state = entry.get("state")
        if name is None or type(state) is not str:
            raise BadProbe("data: id and state expected")
        installed.add(name)
        if state == "loaded":
            loaded.add(name)
    resident = tuple(ResidentModel(name) for name in sorted(loaded))
    return EngineReport(loaded=frozenset(loaded), resident=resident, installed=frozenset(installed))


MAX_INSTANCES = 64


def parseLmStudioV1(body: bytes) -> EngineReport:
    """LM Studio ``GET /api/v1/models``: a model with ``loaded_instances`` is loaded (one
    entry per instance; the first instance's id and config describe it)."""
    resident: list[ResidentModel] = []
    installed: set[str] = set()
    for entry in _entries(_json(body), "models"):
        if type(entry) is not dict:
            raise BadProbe("models: expected objects")
        name = _name(entry.get("key"))
        instances = entry.get("loaded_instances", [])
        if name is None or type(instances) is not list or len(instances) > MAX_INSTANCES:
            raise BadProbe("models: key and loaded_instances expected")
        installed.add(name)
        if not instances:
            continue
        first = instances[0]
        if type(first) is not dict:
            raise BadProbe("loaded_instances: expected objects")
        config = first.get("config")
        config = config if type(config) is dict else {}
        resident.append(
            ResidentModel(
                name,
                sizeBytes=_size(entry.get("size_bytes")),
                instance=_name(first.get("id")),
                contextTokens=_count(config.get("context_length")),
                parallel=_count(config.get("parallel")) or None,
            )
        )
    resident.sort(key=lambda r: r.name)
    loaded = frozenset(r.name for r in resident)
    return EngineReport(loaded=loaded, resident=tuple(resident), installed=frozenset(installed))


def parseOllamaPs(body: bytes) -> EngineReport:
    """Ollama ``GET /api/ps``."""
    models: dict[str, ResidentModel] = {}
    for entry in _entries(_json(body), "models"):
        if type(entry) is not dict:
            raise BadProbe("models: expected objects")
        name = _name(entry.get("model")) or _name(entry.get("name"))
        if name is None:
            raise BadProbe("models: model name expected")
        models[name] = ResidentModel(
            name,
            sizeBytes=_size(entry.get("size")),
            vramBytes=_size(entry.get("size_vram")),
            until=_until(entry.get("expires_at")),
            contextTokens=_count(entry.get("context_length")),
        )
    resident = tuple(models[name] for name in sorted(models))
    expires = tuple((r.name, r.until) for r in resident if r.until is not None)
    return EngineReport(loaded=frozenset(models), expires=expires, resident=resident)


ROUTER_STATES = frozenset(("unloaded", LOADING, LOADED, SLEEPING, "downloading", "downloaded"))


def parseRouterModels(body: bytes) -> EngineReport:
    """llama.cpp router mode ``GET /models``: every installed model with its status; a
    list whose entries carry no status is a single-model server (``NotThisProbe``)."""
    resident: list[ResidentModel] = []
    installed: set[str] = set()
    entries = _entries(_json(body), "data")
    for entry in entries:
        if type(entry) is not dict:
            raise BadProbe("data: expected objects")
        name = _name(entry.get("id"))
        status = entry.get("status")
        if name is None:
            raise BadProbe("data: id expected")
        if type(status) is not dict:
            raise NotThisProbe("not a router: a model without a status")
        value = status.get("value")
        if type(value) is not str or value not in ROUTER_STATES:
            raise BadProbe("data: unknown status")
        installed.add(name)
        if value in (LOADED, LOADING, SLEEPING):
            meta = entry.get("meta")  # the child's own /v1/models entry, once it runs
            size = _size(meta.get("size")) if type(meta) is dict else None
            resident.append(ResidentModel(name, state=value, sizeBytes=size))
    resident.sort(key=lambda r: r.name)
    loaded = frozenset(r.name for r in resident if r.state == LOADED)
    return EngineReport(
        loaded=loaded, resident=tuple(resident), installed=frozenset(installed), router=True
    )


def withChildSlots(report: EngineReport, children: dict[str, EngineReport | None]) -> EngineReport:
    """A router's report with each loaded model's own ``/slots`` (``children``: model ->
    its report, None when unreadable) folded in: per model busy and total; the node's are
    the sums when every loaded model's were read, else unknown (and unknown with no model
    loaded: a router's slots come with the model it loads)."""
    resident: list[ResidentModel] = []
    busy = total = context = 0
    complete = bool(report.loaded)
    for model in report.resident or ():
        child = children.get(model.name) if model.state == LOADED else None
        if model.state == LOADED and (child is None or child.busy is None):
            complete = False
        if child is None:
            resident.append(model)
            continue
        resident.append(
            attrs.evolve(
                model, busy=child.busy, total=child.total, contextTokens=child.contextTokens
            )
        )
        busy += child.busy or 0
        total += child.total or 0
        context += child.contextTokens or 0
    return attrs.evolve(
        report,
        resident=tuple(resident),
        busy=busy if complete else None,
        total=total if complete else None,
        contextTokens=context or None,
    )


PARSERS = {
    b"/slots": parseSlots,
    b"/metrics": parseMetrics,
    b"/api/v0/models": parseLmStudioModels,
    b"/api/v1/models": parseLmStudioV1,
    b"/api/ps": parseOllamaPs,
    b"/models": parseRouterModels,
}


def parseProbe(path: bytes, body: bytes) -> EngineReport:
    """The report of a 2xx answer to the probe ``path``; ``BadProbe`` when unreadable."""
    parser = PARSERS.get(path)
    if parser is None:
        raise BadProbe("no parser for this probe")
    return parser(body)


def parseIdentity(body: bytes) -> bool:
    """Whether a 2xx answer to the engine's identity probe is llama.cpp's own server
    (``llama-server``'s ``/props``: a JSON object naming its ``build_info``), whose prompt
    cache (``--cache-ram``, on by default) moves a saved prompt into the slot of the request
    that matches it best instead of copying it.  Anything else, malformed or not, is not."""
    try:
        doc = _json(body)
    except BadProbe:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("build_info"), str)
