"""The engine table moved to ``nvpair.proxy.engines`` (routing and http read it, and they must
not import the facade package); this name stays for importers not yet switched."""

from nvpair.proxy.engines import (
    ENGINES,
    LLAMACPP,
    LMSTUDIO,
    OLLAMA,
    Engine,
    RouteClass,
    ollamaModel,
)

__all__ = ["ENGINES", "LLAMACPP", "LMSTUDIO", "OLLAMA", "Engine", "RouteClass", "ollamaModel"]
