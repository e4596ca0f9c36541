"""Each engine's own API to load and unload a model (protocol §9; spec §11, "Model
residency"): the requests and how to read their answers, pure.

* **Ollama** (``server/routes.go``): ``POST /api/generate`` naming the model with no prompt
  loads it and answers once it is loaded (``done_reason: "load"``); ``keep_alive: -1`` keeps
  it loaded until it must make room (a preload is meant to stay); ``keep_alive: 0`` unloads
  it (``"unload"``).
* **llama.cpp in router mode** (``tools/server/server-models.cpp``): ``POST /models/load``
  ``{"model"}`` answers ``{"success": true}`` at once and loads in the background (400
  "already running" when it is); ``POST /models/unload`` ``{"model"}`` (400 "not running"
  when it is not).  A single-model server has neither route (404).
* **LM Studio's v1 REST API**: ``POST /api/v1/models/load`` ``{"model"}`` answers once
  loaded, with ``instance_id`` and ``load_time_seconds``; it loads *another instance* of a
  model already loaded, so it is only asked for a model known not to be
  (``idempotent`` False); ``POST /api/v1/models/unload`` ``{"instance_id"}``.  An LM Studio
  without the v1 API (before 0.4) cannot be asked (404).
"""

from __future__ import annotations

import json
from enum import Enum

import attrs

__all__ = ["MODEL_APIS", "ApiCall", "ModelApi", "Outcome"]


class Outcome(Enum):
    """What an answer to a load or unload means."""

    DONE = "done"
    """Done (or nothing to do: already loaded, already gone)."""
    RETRY = "retry"
    """Not now (the engine is down, busy or failing): ask again later."""
    REFUSED = "refused"
    """The engine cannot do it (no such route, no such model): do not ask again."""


@attrs.frozen
class ApiCall:
    """One request to an engine."""

    method: bytes
    path: bytes
    body: bytes


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


@attrs.frozen
class ModelApi:
    """One engine's load and unload requests."""

    loadPath: bytes
    unloadPath: bytes
    asynchronous: bool
    """The load answers at once and goes on in the background (router mode)."""
    idempotent: bool
    """Asking to load a model that is loaded does no harm (false: LM Studio)."""
    loadField: str = "model"
    keepAlive: bool = False
    instanceUnload: bool = False
    alreadyIs: int | None = None
    """A status meaning "already loaded" (or "already gone") rather than a refusal."""

    def load(self, model: str) -> ApiCall:
        """The request that loads ``model``."""
        doc: dict[str, object] = {"model": model}
        if self.keepAlive:
            doc["keep_alive"] = -1
        return ApiCall(b"POST", self.loadPath, _json(doc))

    def unload(self, model: str, instance: str | None = None) -> ApiCall:
        """The request that unloads ``model`` (LM Studio: its instance, by default its key)."""
        if self.instanceUnload:
            return ApiCall(b"POST", self.unloadPath, _json({"instance_id": instance or model}))
        doc: dict[str, object] = {"model": model}
        if self.keepAlive:
            doc["keep_alive"] = 0
        return ApiCall(b"POST", self.unloadPath, _json(doc))

    def outcome(self, status: int) -> Outcome:
        """What an answer's status means."""
        if 200 <= status < 300 or status == self.alreadyIs:
            return Outcome.DONE
        if status in (408, 429) or status >= 500:
            return Outcome.RETRY
        return Outcome.REFUSED


def loadSeconds(body: bytes) -> float | None:
    """LM Studio's ``load_time_seconds`` in a load answer (None: not there or not a number)."""
    if len(body) > 65536:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    seconds = doc.get("load_time_seconds") if isinstance(doc, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return float(seconds) if 0 <= seconds <= 3600 else None


MODEL_APIS: dict[str, ModelApi] = {
    "ollama": ModelApi(
        b"/api/generate", b"/api/generate", asynchronous=False, idempotent=True, keepAlive=True
    ),
    "llamacpp": ModelApi(
        b"/models/load", b"/models/unload", asynchronous=True, idempotent=True, alreadyIs=400
    ),
    "lmstudio": ModelApi(
        b"/api/v1/models/load",
        b"/api/v1/models/unload",
        asynchronous=False,
        idempotent=False,
        instanceUnload=True,
    ),
}
"""Engine id -> its model API (the engine table's ids)."""
