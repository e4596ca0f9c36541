"""Admission (spec §5 step 1, protocol §11): what a request is and whether it may go on.

Pure code: route class, the model a body names, and the refusals (400) that need no
engine.  The body limit (413) is enforced while the body is read, in ``site``.  When
conversation affinity is on, the parsed document of an admitted inference request is kept
in ``documents`` until the dispatch loop, started right after, takes it (one at a time).
"""

from __future__ import annotations

import json

import attrs

from nvpair.proxy.engines import Engine, RouteClass


@attrs.frozen
class Admitted:
    """A request that may be routed: its class and, when it names one, its normalized model."""

    routeClass: RouteClass
    model: str | None


@attrs.frozen
class Refused:
    """A request answered by the proxy at admission."""

    status: int
    reason: str
    message: str


_decoder = json.JSONDecoder()


class DocumentMemo:
    """The last JSON object admission parsed, kept (when enabled) for one later reader of
    the same body, so that conversation affinity does not parse the body a second time."""

    __slots__ = ("enabled", "_body", "_doc")

    def __init__(self) -> None:
        self.enabled = False
        self._body: bytes | None = None
        self._doc: dict[str, object] | None = None

    def keep(self, body: bytes, doc: dict[str, object]) -> None:
        """Remember ``doc`` as the document of this very ``body`` object."""
        if self.enabled:
            self._body, self._doc = body, doc

    def take(self, body: bytes) -> dict[str, object] | None:
        """The document of ``body`` (the same object) if it is the one kept; forgotten here."""
        kept, doc = self._body, self._doc
        self._body = self._doc = None
        if kept is body and kept is not None:
            return doc
        return bodyDocument(body)


documents = DocumentMemo()


def bodyDocument(body: bytes) -> dict[str, object] | None:
    """The body parsed as a JSON object, or None when it is not one."""
    stripped = body.lstrip()
    if not stripped.startswith(b"{"):
        return None
    try:
        if stripped[1:2] != b"\x00":
            # What ``json.loads`` does with these bytes: no BOM and no NUL in the second
            # byte is UTF-8 to its encoding detection.
            doc = _decoder.decode(stripped.decode("utf-8", "surrogatepass"))
        else:
            doc = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def bodyModel(body: bytes) -> str | None:
    """The string ``model`` of a JSON object body, or None when there is none."""
    doc = bodyDocument(body)
    if doc is None:
        return None
    model = doc.get("model")
    return model if isinstance(model, str) else None


def admit(engine: Engine, method: bytes, path: bytes, body: bytes) -> Admitted | Refused:
    """Classify a request and check an inference body names a model."""
    routeClass = engine.classify(method, path)
    if routeClass is RouteClass.INFERENCE:
        doc = bodyDocument(body)
        model = doc.get("model") if doc is not None else None
        if not isinstance(model, str):
            return Refused(400, "bad_request", "the body must be a JSON object with a string model")
        assert doc is not None
        documents.keep(body, doc)
        return Admitted(routeClass, engine.normalize(model))
    if routeClass is RouteClass.VERBATIM and body:
        model = bodyModel(body)
        return Admitted(routeClass, engine.normalize(model) if model is not None else None)
    return Admitted(routeClass, None)
