"""The engines' own model-management routes, as the simulated engine serves them (spec §16).

* **Ollama**: ``POST /api/generate`` (or ``/api/chat``) naming a model and no prompt (no
  messages) loads it and answers ``done_reason: "load"`` once it is loaded; with
  ``keep_alive: 0`` it unloads it (``"unload"``).  Any request's ``keep_alive`` (seconds, a
  Go duration such as ``"5m"``, negative: for ever) becomes its model's keep-alive.
  ``GET /api/ps`` lists the resident models (a model loading too, as Ollama does) with
  ``size``, ``size_vram``, ``expires_at`` and ``context_length``.
* **llama-server in router mode** (``--router``), as ``tools/server/server-models.cpp``:
  ``GET /models`` (and ``/v1/models``) lists every installed model with ``status.value``
  ``unloaded``, ``loading`` or ``loaded``; ``POST /models/load`` answers
  ``{"success": true}`` at once and loads in the background (404 unknown, 400 already
  running); ``POST /models/unload`` (400 unknown or not running); ``GET /props`` without
  ``model`` is the router's own (``role: "router"``); ``/props``, ``/slots`` and
  ``/metrics`` need ``?model=`` (400 without) and, like a POST, *load* a model that is not
  loaded unless ``autoload=false`` (then 400 ``model is not loaded``); ``--no-models-autoload``
  makes ``autoload=false`` the default.  Each model has its own slots.
* **LM Studio's v1 REST API** (``lmstudioV1``): ``GET /api/v1/models`` (every model, with
  ``loaded_instances``), ``POST /api/v1/models/load`` (answers once loaded, with
  ``instance_id`` and ``load_time_seconds``) and ``POST /api/v1/models/unload``
  (``{"instance_id"}``).
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote_to_bytes

from nvpair.proxy.testing.fakeengine.connection import EngineConnection
from nvpair.proxy.testing.fakeengine.dialects import CREATED, CREATED_AT
from nvpair.proxy.testing.simengine import state
from nvpair.proxy.testing.simengine.core import Core
from nvpair.proxy.testing.simengine.replies import dumps, errorBody

MODEL_BYTES = 300_000_000  # every simulated model's size in memory
NEVER = 10 * 365 * 86400.0  # how far away "for ever" is written in expires_at
_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_INFERENCE = (
    b"/v1/chat/completions",
    b"/v1/completions",
    b"/chat/completions",
    b"/completions",
)


def _object(body: bytes) -> dict[str, object] | None:
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def keepAliveSeconds(value: object) -> float | None | str:
    """Ollama's ``keep_alive`` in seconds (None: for ever), or ``"bad"``."""
    if isinstance(value, bool):
        return "bad"
    if isinstance(value, int | float):
        return None if value < 0 else float(value)
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match is not None and (match.group(2) or float(match.group(1)) == 0):
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
            return None if seconds < 0 else seconds
    return "bad"


def answer(
    core: Core, connection: EngineConnection, method: bytes, path: bytes, query: bytes,
    body: bytes,
) -> bool:  # fmt: skip
    """Answer a model-management route (or refuse a router request); False: not one."""
    config = core.config
    if config.router:
        return _router(core, connection, method, path, query, body)
    if config.dialect == "lmstudio" and config.lmstudioV1 and path.startswith(b"/api/v1/"):
        return _lmstudio(core, connection, method, path, body)
    if config.dialect == "ollama":
        if method == b"GET" and path == b"/api/ps":
            core.document(connection, 200, psDocument(core))
            return True
        if method == b"POST" and path in (b"/api/generate", b"/api/chat"):
            return _ollama(core, connection, path, body)
    return False


def psDocument(core: Core) -> bytes:
    """Ollama's ``/api/ps``: the resident models (loading included), sizes and expiry."""
    residency, now = core.residency, core.clock.seconds()
    resident = [(m, until) for m, until in residency.loadedModels()]
    if residency.loading is not None:
        keep = residency.keepAlive(residency.loading)
        resident.append((residency.loading, None if keep is None else now + keep))
    models = []
    for name, until in sorted(resident, key=lambda r: -(r[1] or now + NEVER)):
        models.append(
            {
                "name": name,
                "model": name,
                "size": MODEL_BYTES,
                "digest": "0" * 64,
                "details": {"format": "gguf", "family": "sim", "parameter_size": "270M"},
                "expires_at": state.rfc3339(now + NEVER if until is None else until),
                "size_vram": MODEL_BYTES,
                "context_length": core.config.nCtx,
            }
        )
    return dumps({"models": models})


def _ollama(core: Core, connection: EngineConnection, path: bytes, body: bytes) -> bool:
    doc = _object(body)
    if doc is None or not isinstance(doc.get("model"), str):
        return False  # the inference path refuses it
    served = core.resolve(str(doc["model"]))
    keep = keepAliveSeconds(doc["keep_alive"]) if "keep_alive" in doc else "absent"
    if keep == "bad":
        core.document(connection, 400, dumps({"error": "invalid keep_alive"}))
        return True
    prompt = doc.get("messages") if path == b"/api/chat" else doc.get("prompt")
    if prompt:
        if served is not None and not isinstance(keep, str):
            core.residency.setKeepAlive(served, keep)
        return False  # an inference request: served as usual
    if served is None:
        error = f"model '{doc['model']}' not found, try pulling it first"
        core.document(connection, 404, dumps({"error": error}))
        return True
    chat = path == b"/api/chat"

    def done(reason: str) -> None:
        reply: dict[str, object] = {"model": doc["model"], "created_at": CREATED_AT}
        if chat:
            reply["message"] = {"role": "assistant", "content": ""}
        else:
            reply["response"] = ""
        reply.update(done=True, done_reason=reason)
        core.document(connection, 200, dumps(reply))

    if keep == 0.0:
        core.residency.unload(served)
        done("unload")
        return True
    if not isinstance(keep, str):
        core.residency.setKeepAlive(served, keep)
    core.residency.want(served, lambda waited: done("load"))
    return True


def _autoload(core: Core, query: bytes) -> bool:
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"autoload" and value:
            return value in (b"true", b"1")
    return core.config.autoload


def _param(query: bytes, key: bytes) -> str:
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == key:
            return unquote_to_bytes(value).decode("utf-8", "replace")
    return ""


def _bad(core: Core, connection: EngineConnection, status: int, message: str) -> None:
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    core.document(connection, status, errorBody("llamacpp", False, status, message, kind))


def _router(
    core: Core, connection: EngineConnection, method: bytes, path: bytes, query: bytes,
    body: bytes,
) -> bool:  # fmt: skip
    residency = core.residency
    if method == b"GET" and path in (b"/models", b"/v1/models"):
        core.document(connection, 200, _routerList(core))
        return True
    if method == b"POST" and path in (b"/models/load", b"/models/unload"):
        doc = _object(body) or {}
        name = doc.get("model")
        model = name if isinstance(name, str) and name in residency.installed else None
        if path == b"/models/load":
            if model is None:
                _bad(core, connection, 404, "model is not found")
            elif not residency.load(model):
                _bad(core, connection, 400, "model is already running")
            else:
                core.document(connection, 200, b'{"success":true}')
        elif model is None:
            _bad(core, connection, 400, "model is not found")
        elif not residency.unload(model):
            _bad(core, connection, 400, "model is not running")
        else:
            core.document(connection, 200, b'{"success":true}')
        return True
    if method == b"GET" and path in (b"/props", b"/slots", b"/metrics"):
        asked = _param(query, b"model")
        if path == b"/props" and not asked:
            core.document(connection, 200, _routerProps(core))
            return True
        if _refused(core, connection, asked, _autoload(core, query)):
            return True
        residency.want(asked, lambda waited: _child(core, connection, path, asked))
        return True
    if method == b"POST" and path in _INFERENCE:
        request = _object(body)
        if request is not None:
            named = request.get("model")
            model = named if isinstance(named, str) else ""
            return _refused(core, connection, model, _autoload(core, query))
    return False


def _refused(core: Core, connection: EngineConnection, model: str, autoload: bool) -> bool:
    """The router's checks of a request naming ``model`` (True: refused, answered)."""
    residency = core.residency
    if not model:
        _bad(core, connection, 400, "model name is missing from the request")
    elif model not in residency.installed:
        _bad(core, connection, 400, f"model '{model}' not found")
    elif not autoload and residency.status(model) == "unloaded":
        _bad(core, connection, 400, "model is not loaded")
    else:
        return False
    return True


def _routerList(core: Core) -> bytes:
    residency, config = core.residency, core.config
    data = []
    for model in residency.installed:
        status = residency.status(model)
        entry: dict[str, object] = {
            "id": model,
            "aliases": [],
            "tags": [],
            "object": "model",
            "owned_by": "llamacpp",
            "created": CREATED,
            "status": {"value": status, "args": ["llama-server", "--model", model]},
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": "models_dir",
            "can_remove": False,
        }
        if status == "loaded":
            entry["meta"] = {"n_ctx": config.nCtx, "size": MODEL_BYTES}
        data.append(entry)
    return dumps({"data": data, "object": "list"})


def _routerProps(core: Core) -> bytes:
    return dumps(
        {
            "role": "router",
            "max_instances": core.config.maxLoaded,
            "models_autoload": core.config.autoload,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
        }
    )


def _child(core: Core, connection: EngineConnection, path: bytes, model: str) -> None:
    """One model's own ``/props``, ``/slots`` or ``/metrics`` (its child server's)."""
    slots, config = core.slotsFor(model), core.config
    busy = [slots.isBusy(i) for i in range(slots.total)]
    if path == b"/props":
        doc = {
            "model_alias": model,
            "model_path": model,
            "total_slots": slots.total,
            "default_generation_settings": {"params": {}, "n_ctx": config.nCtx},
        }
        core.document(connection, 200, dumps(doc))
    elif path == b"/slots":
        tasks = [
            job.task if (job := slots.jobAt(i)) is not None else -1 for i in range(slots.total)
        ]
        core.document(connection, 200, state.slotsDocument(busy, config.nCtx, tasks))
    else:
        s = core.stats
        text = state.metricsText(
            s.promptTokens - s.cachedTokens, s.promptSeconds, s.completionTokens,
            s.predictedSeconds, s.decodes, slots.busy, slots.queued,
        )  # fmt: skip
        core.responder.sendDocument(
            connection, 200, None, text, b"text/plain; version=0.0.4; charset=utf-8"
        )


def _lmstudio(
    core: Core, connection: EngineConnection, method: bytes, path: bytes, body: bytes
) -> bool:
    residency, config = core.residency, core.config

    def refuse(status: int, message: str) -> None:
        kind = "model_not_found" if status == 404 else "invalid_request_error"
        core.document(connection, status, errorBody("lmstudio", False, status, message, kind))

    if method == b"GET" and path == b"/api/v1/models":
        loaded = {m for m, _ in residency.loadedModels()}
        models = []
        for model in residency.installed:
            instances = []
            if model in loaded:
                config_ = {"context_length": config.nCtx, "parallel": config.slots}
                instances.append({"id": model, "config": config_})
            models.append(
                {
                    "type": "llm",
                    "publisher": "sim",
                    "key": model,
                    "display_name": model,
                    "quantization": {"name": "Q4_K_M", "bits_per_weight": 4.5},
                    "size_bytes": MODEL_BYTES,
                    "params_string": "270M",
                    "loaded_instances": instances,
                    "max_context_length": config.nCtx,
                    "format": "gguf",
                }
            )
        core.document(connection, 200, dumps({"models": models}))
        return True
    if method != b"POST" or path not in (b"/api/v1/models/load", b"/api/v1/models/unload"):
        return False
    doc = _object(body) or {}
    if path == b"/api/v1/models/load":
        key = doc.get("model")
        if not isinstance(key, str) or key not in residency.installed:
            refuse(404, f"Model '{key}' not found")
            return True

        def ready(waited: float) -> None:
            reply = {
                "type": "llm",
                "instance_id": key,
                "load_time_seconds": round(waited, 3),
                "status": "loaded",
            }
            core.document(connection, 200, dumps(reply))

        residency.want(key, ready)
        return True
    instance = doc.get("instance_id")
    if not isinstance(instance, str) or not residency.unload(instance):
        refuse(404, f"No loaded instance '{instance}'")
        return True
    core.document(connection, 200, dumps({"instance_id": instance}))
    return True
