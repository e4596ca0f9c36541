"""Which routes a simulated engine serves in each dialect, and how it answers them.

Every dialect serves OpenAI-style ``/v1/chat/completions`` and ``/v1/completions`` (SSE
when ``"stream": true``); llama.cpp adds ``/chat/completions``, ``/models``, ``/slots`` and
``/metrics``; LM Studio its ``/api/v0/*`` routes and model states; Ollama ``/api/chat`` and
``/api/generate`` (NDJSON, streaming unless ``"stream": false``), ``/api/tags``,
``/api/ps`` (``residency.routes``) and ``/api/version``. All of them answer the
routers' probes (``/health``, SGLang's ``/model_info`` and ``/server_info`` and their older
``/get_*`` names, vLLM's ``POST /tokenize``).
"""

from __future__ import annotations

import json

from nvpair.proxy.testing.fakeengine.connection import EngineConnection
from nvpair.proxy.testing.fakeengine.dialects import Listing, Route, listDocument
from nvpair.proxy.testing.simengine import state
from nvpair.proxy.testing.simengine.core import Core
from nvpair.proxy.testing.simengine.replies import Reply, dumps, errorBody
from nvpair.proxy.testing.simengine.run import Run
from nvpair.proxy.testing.simengine.tokens import promptWords

_OPENAI = {b"/v1/chat/completions": Route.CHAT, b"/v1/completions": Route.COMPLETION}

INFERENCE: dict[str, dict[bytes, Route]] = {
    "llamacpp": {**_OPENAI, b"/chat/completions": Route.CHAT, b"/completions": Route.COMPLETION},
    "lmstudio": {
        **_OPENAI,
        b"/api/v0/chat/completions": Route.CHAT,
        b"/api/v0/completions": Route.COMPLETION,
    },
    "ollama": {**_OPENAI, b"/api/chat": Route.OLLAMA_CHAT, b"/api/generate": Route.OLLAMA_GENERATE},
}
"""POST path -> inference route, per dialect."""

GETS: dict[str, frozenset[bytes]] = {
    "*": frozenset(
        (b"/health", b"/get_model_info", b"/model_info", b"/get_server_info", b"/server_info")
    ),
    "llamacpp": frozenset((b"/v1/models", b"/models", b"/slots", b"/metrics")),
    "lmstudio": frozenset((b"/v1/models", b"/api/v0/models")),
    "ollama": frozenset((b"/v1/models", b"/api/tags", b"/api/ps", b"/api/version")),
}
"""GET paths answered from the engine's state, per dialect (``*``: all of them)."""

_NATIVE = (Route.OLLAMA_CHAT, Route.OLLAMA_GENERATE)


def _notSupported(what: str, flag: str) -> bytes:
    message = f"This server does not support {what} endpoint. Start it with `{flag}`"
    return dumps({"error": {"code": 501, "message": message, "type": "not_supported_error"}})


def answerGet(core: Core, connection: EngineConnection, path: bytes, query: bytes = b"") -> None:
    """Answer a state, list or probe route from the engine's live state
    (``/slots?fail_on_no_slot=1`` is 503 when no slot is idle, as in llama-server)."""
    config, slots = core.config, core.slots
    models = list(config.models)
    body: bytes
    if path == b"/health":
        body = b'{"status":"ok"}'
    elif path in (b"/get_model_info", b"/model_info"):
        body = state.modelInfo(models[0])
    elif path in (b"/get_server_info", b"/server_info"):
        body = state.serverInfo(models[0], config.slots, config.nCtx, config.cacheTokens)
    elif path == b"/api/tags":
        body = listDocument(Listing.TAGS, models)
    elif path in (b"/v1/models", b"/models"):
        body = listDocument(Listing.MODELS, models)
    elif path == b"/api/version":
        body = b'{"version":"0.0.0-sim"}'
    elif path == b"/api/v0/models":
        loaded = {m for m, _ in core.loadedModels()}
        body = state.lmstudioModels([(m, m in loaded) for m in models], config.nCtx)
    elif path == b"/slots":
        if not config.slotsEndpoint:
            core.document(connection, 501, _notSupported("slots", "--slots"))
            return
        busy = [slots.shownBusy(i) for i in range(slots.total)]
        if all(busy) and any(
            p.startswith(b"fail_on_no_slot=") and p != b"fail_on_no_slot="
            for p in query.split(b"&")
        ):
            error = {"code": 503, "message": "no slot available", "type": "unavailable_error"}
            core.document(connection, 503, dumps({"error": error}))
            return
        tasks = [core.taskAt(i) for i in range(slots.total)]
        body = state.slotsDocument(busy, config.nCtx, tasks)
    else:  # /metrics
        if not config.metricsEndpoint:
            core.document(connection, 501, _notSupported("metrics", "--metrics"))
            return
        s = core.stats
        text = state.metricsText(
            s.promptTokens - s.cachedTokens,
            s.promptSeconds,
            s.completionTokens,
            s.predictedSeconds,
            s.decodes,
            sum(slots.shownBusy(i) for i in range(slots.total)),
            slots.queued,
        )
        core.responder.sendDocument(
            connection, 200, None, text, b"text/plain; version=0.0.4; charset=utf-8"
        )
        return
    core.document(connection, 200, body)


def _maxTokens(doc: dict[str, object], default: int, cap: int) -> int:
    options = doc.get("options")
    asked: list[object] = [
        doc.get("max_tokens"),
        doc.get("max_completion_tokens"),
        doc.get("n_predict"),
    ]
    if isinstance(options, dict):
        asked.append(options.get("num_predict"))
    for value in asked:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, cap)
    return min(default, cap)


def inference(core: Core, connection: EngineConnection, route: Route, body: bytes) -> None:
    """Answer an inference request: refuse it, fail it (``/sim/fail``) or run it."""
    config = core.config
    native = route in _NATIVE
    dialect = config.dialect

    def refuse(status: int, message: str, kind: str) -> None:
        core.document(connection, status, errorBody(dialect, native, status, message, kind))

    try:
        doc: object = json.loads(body)
    except ValueError:
        refuse(400, "the body is not JSON", "invalid_request_error")
        return
    if not isinstance(doc, dict):
        refuse(400, "the body must be a JSON object", "invalid_request_error")
        return
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        if dialect != "llamacpp":
            refuse(400, "model is required", "invalid_request_error")
            return
        model = config.models[0]
    served = core.resolve(model)
    if served is None:
        refuse(404, f"model '{model}' not found", "not_found_error")
        return
    words = promptWords(doc, route in (Route.CHAT, Route.OLLAMA_CHAT))
    if words is None:
        refuse(400, "no prompt (messages or prompt)", "invalid_request_error")
        return

    def error(status: int, message: str, kind: str) -> bytes:
        return errorBody(dialect, native, status, message, kind)

    if core.turnedAway(connection, len(words), refuse, error):
        return
    stream = doc.get("stream")
    options = doc.get("stream_options")
    includeUsage = isinstance(options, dict) and options.get("include_usage") is True
    prefix = "chatcmpl" if route is Route.CHAT else "cmpl"
    ident = f"{prefix}-{config.name}-{core.stats.requests}"
    reply = Reply(dialect, route, model, ident, includeUsage)
    streaming = stream is not False if native else stream is True
    maxTokens = _maxTokens(doc, config.outputTokens, config.maxOutputTokens)
    run = Run(core, connection, reply, streaming, words, maxTokens, core.untrack, served)
    core.track(connection, run)
    if not run.begin():
        core.untrack(run)
        core.stats.refused += 1
        refuse(
            503,
            "server busy, please try again. maximum pending requests exceeded",
            "unavailable_error",
        )
