"""The simulated engine's control routes (for tests and benchmarks) and ``POST /tokenize``.

* ``POST /sim/fail`` ``{"status": 503, "delay_ms": 20, "retry_after": 2}``: from now on every
  inference request fails with ``status`` after ``delay_ms`` (``Retry-After`` when given);
* ``POST /sim/heal``: back to normal;
* ``POST /sim/hold`` ``{"slots": k, "reported": true}``: ``k`` slots are taken as by
  clients reaching the engine directly (0 gives them back); with ``"reported": false``,
  ``/slots`` and ``/metrics`` do not show them (a client that came after the last probe);
* ``POST /sim/unload`` ``{"model": "m"}``: unload a model (the next request loads it);
* ``POST /sim/flush``: empty the prefix cache;
* ``POST /sim/reset``: zero the counters (not the cache);
* ``GET /sim/stats``: the counters and the live state.
"""

from __future__ import annotations

import json

from nvpair.proxy.testing.fakeengine.connection import EngineConnection
from nvpair.proxy.testing.simengine.config import Failure
from nvpair.proxy.testing.simengine.core import Core
from nvpair.proxy.testing.simengine.replies import dumps
from nvpair.proxy.testing.simengine.state import tokenizeDocument
from nvpair.proxy.testing.simengine.tokens import MAX_WORDS, chatWords, tokenId, words

_OK = b'{"ok":true}'


def _bad(message: str) -> bytes:
    return dumps({"error": {"code": 400, "message": message, "type": "invalid_request_error"}})


def _object(body: bytes) -> dict[str, object] | None:
    if not body:
        return {}
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def parseFailure(doc: dict[str, object]) -> Failure | str:
    """The failure a ``/sim/fail`` body asks for, or what is wrong with it."""
    status = doc.get("status", 503)
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        return "status must be an integer from 400 to 599"
    delay = _number(doc.get("delay_ms", 0))
    if delay is None or not 0 <= delay <= 600_000:
        return "delay_ms must be a number from 0 to 600000"
    retry = doc.get("retry_after")
    if retry is not None and (not isinstance(retry, int) or isinstance(retry, bool) or retry < 0):
        return "retry_after must be a non-negative integer or null"
    return Failure(status, delay, retry)


def answer(
    core: Core, connection: EngineConnection, method: bytes, path: bytes, body: bytes
) -> None:
    """Answer a control route or ``/tokenize``; 404 for anything else, 405 for a wrong method."""
    if path == b"/sim/stats":
        if method != b"GET":
            core.document(connection, 405, _bad("GET only"))
            return
        core.document(connection, 200, core.statsDocument())
        return
    if method != b"POST":
        core.document(connection, 405, _bad("POST only"))
        return
    doc = _object(body)
    if doc is None:
        core.document(connection, 400, _bad("the body must be a JSON object"))
        return
    if path == b"/tokenize":
        _tokenize(core, connection, doc)
    elif path == b"/sim/fail":
        failure = parseFailure(doc)
        if isinstance(failure, str):
            core.document(connection, 400, _bad(failure))
            return
        core.failure = failure
        core.document(connection, 200, _OK)
    elif path == b"/sim/heal":
        core.failure = None
        core.document(connection, 200, _OK)
    elif path == b"/sim/hold":
        k = doc.get("slots")
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            core.document(connection, 400, _bad("slots must be a non-negative integer"))
            return
        reported = doc.get("reported", True)
        if not isinstance(reported, bool):
            core.document(connection, 400, _bad("reported must be a boolean"))
            return
        core.slots.hold(k, reported)
        core.document(connection, 200, _OK)
    elif path == b"/sim/unload":
        model = doc.get("model")
        if not isinstance(model, str):
            core.document(connection, 400, _bad("model must be a string"))
            return
        core.residency.unload(model)
        core.document(connection, 200, _OK)
    elif path == b"/sim/flush":
        core.cache.clear()
        core.document(connection, 200, _OK)
    elif path == b"/sim/reset":
        core.stats.reset()
        for slots in (core.slots, *core.modelSlots.values()):
            slots.resetWaits()
        core.residency.stats.reset()
        core.document(connection, 200, _OK)
    else:
        core.document(connection, 404, _bad("no such control route"))


def _tokenize(core: Core, connection: EngineConnection, doc: dict[str, object]) -> None:
    content, prompt, messages = doc.get("content"), doc.get("prompt"), doc.get("messages")
    if isinstance(content, str):
        tokens, llama = words(content), True
    elif isinstance(prompt, str):
        tokens, llama = words(prompt), False
    elif isinstance(messages, list):
        tokens, llama = chatWords(messages), False
    else:
        core.document(connection, 400, _bad("give content, prompt or messages"))
        return
    if len(tokens) > MAX_WORDS:
        core.document(connection, 400, _bad("too many tokens"))
        return
    ids = [tokenId(w) for w in tokens]
    core.document(connection, 200, tokenizeDocument(ids, llama, core.config.nCtx))
