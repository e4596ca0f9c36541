"""The engine table: everything engine-specific, one entry per engine (spec §10, protocol §11).

Adding an engine is adding an ``Engine`` to ``ENGINES``; nothing else names an engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from enum import Enum

import attrs
from zope.interface import implementer

from nvpair.proxy.errorshape import IErrorShape


class RouteClass(Enum):
    """How a facade treats a request (protocol §11)."""

    INFERENCE = "inference"
    FLEET_LIST = "list"
    VERBATIM = "verbatim"


def _identity(model: str) -> str:
    return model


def ollamaModel(model: str) -> str:
    """Ollama's implicit tag: a name without a tag means ``name:latest``."""
    return model if ":" in model.rsplit("/", 1)[-1] else model + ":latest"


@implementer(IErrorShape)
@attrs.frozen
class Engine:
    """One engine's identity, ports, routes, model normalization and error shapes."""

    id: str
    ownPort: int
    relocatedPort: int
    standalonePort: int
    portFile: str
    defaultBackend: str
    inferenceRoutes: frozenset[bytes]
    listRoutes: frozenset[bytes]
    inventoryRoute: bytes
    normalize: Callable[[str], str] = _identity
    nativeErrorPrefixes: tuple[bytes, ...] = ()
    listSources: Mapping[bytes, tuple[bytes, ...]] = attrs.field(factory=dict)
    # How standalone mode reads the engine's own state (spec §10): these paths in order, the
    # next one once a server answers 404 or 501 (routing/engineprobe.py parses each).
    stateProbes: tuple[bytes, ...] = ()
    # llama.cpp router mode (spec §11): a server answering its state probe 400 ("model name
    # is missing") is asked this list; statuses there mean a router, probed per model.
    routerProbe: bytes | None = None

    def listPaths(self, path: bytes) -> tuple[bytes, ...]:
        """Which path(s) to ask each node for a fleet list route: the first that is not 404."""
        return self.listSources.get(path, (path,))

    def classify(self, method: bytes, path: bytes) -> RouteClass:
        """Classify a request by method and path (without query)."""
        if method == b"POST" and path in self.inferenceRoutes:
            return RouteClass.INFERENCE
        if method == b"GET" and path in self.listRoutes:
            return RouteClass.FLEET_LIST
        return RouteClass.VERBATIM

    def usesNativeErrors(self, path: bytes) -> bool:
        """Whether generated errors on this path use the engine's native (Ollama) shape."""
        return any(path.startswith(p) for p in self.nativeErrorPrefixes)

    def errorBody(self, path: bytes, reason: str, message: str) -> bytes:
        """The engine's error shape for a response the proxy generates itself."""
        if self.usesNativeErrors(path):
            doc: object = {"error": message, "reason": reason}
        else:
            doc = {"error": {"message": message, "type": "proxy_error", "code": reason}}
        return json.dumps(doc).encode("utf-8")

    def streamsByDefault(self, path: bytes) -> bool:
        """Ollama's native routes stream unless told not to; OpenAI-style ones do not."""
        return self.usesNativeErrors(path)

    def statsDialect(self, path: bytes) -> str:
        """Which body dialect the statistics meter reads on this route."""
        return "ollama" if self.usesNativeErrors(path) else "openai"


_OPENAI = (b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings")

OLLAMA = Engine(
    id="ollama",
    ownPort=11434,
    relocatedPort=11435,
    standalonePort=11435,
    portFile="proxy-port.json",
    defaultBackend="http://127.0.0.1:11434",
    inferenceRoutes=frozenset(
        (b"/api/generate", b"/api/chat", b"/api/embed", b"/api/embeddings", *_OPENAI)
    ),
    listRoutes=frozenset((b"/api/tags", b"/v1/models")),
    inventoryRoute=b"/api/tags",
    normalize=ollamaModel,
    nativeErrorPrefixes=(b"/api/",),
    stateProbes=(b"/api/ps",),
)

LMSTUDIO = Engine(
    id="lmstudio",
    ownPort=1234,
    relocatedPort=1235,
    standalonePort=1234,
    portFile="lmstudio-proxy-port.json",
    defaultBackend="http://127.0.0.1:1235",
    inferenceRoutes=frozenset(
        (
            *_OPENAI,
            b"/v1/responses",
            b"/api/v0/chat/completions",
            b"/api/v0/completions",
            b"/api/v0/embeddings",
        )
    ),
    listRoutes=frozenset((b"/v1/models", b"/api/v0/models")),
    inventoryRoute=b"/v1/models",
    stateProbes=(b"/api/v1/models", b"/api/v0/models"),
)

LLAMACPP = Engine(
    id="llamacpp",
    ownPort=8080,
    relocatedPort=8081,
    standalonePort=8080,
    portFile="llamacpp-proxy-port.json",
    defaultBackend="http://127.0.0.1:8081",
    inferenceRoutes=frozenset((*_OPENAI, b"/v1/rerank")),
    listRoutes=frozenset((b"/models", b"/v1/models")),
    inventoryRoute=b"/v1/models",
    # Spec §5: both list routes are the fleet's GET /models; servers that only know the
    # OpenAI path (llama-cpp-python) answer it on /v1/models instead.
    listSources={
        b"/models": (b"/models", b"/v1/models"),
        b"/v1/models": (b"/models", b"/v1/models"),
    },
    stateProbes=(b"/slots", b"/metrics"),
    routerProbe=b"/models",
)

ENGINES: dict[str, Engine] = {e.id: e for e in (OLLAMA, LMSTUDIO, LLAMACPP)}
