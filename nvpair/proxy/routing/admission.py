"""Admission (spec §5 step 1, protocol §11): what a request is and whether it may go on.

Pure code: route class, the model a body names, and the refusals (400) that need no
engine.  The body limit (413) is enforced while the body is read, in ``site``.  An
admitted inference request carries its parsed body along, so that conversation affinity
does not parse it a second time.
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
    document: dict[str, object] | None = attrs.field(default=None, eq=False, repr=False)
    """The parsed JSON object body of an inference request (never logged or compared)."""


@attrs.frozen
class Refused:
    """A request answered by the proxy at admission."""

    status: int
    reason: str
    message: str


_decoder = json.JSONDecoder()


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
    """Classify a request and check an inference (or model-routed) body names a model."""
    routeClass = engine.classify(method, path)
    if routeClass is RouteClass.INFERENCE or routeClass is RouteClass.MODEL_ROUTED:
        doc = bodyDocument(body)
        model = doc.get("model") if doc is not None else None
        if not isinstance(model, str):
            return Refused(400, "bad_request", "the body must be a JSON object with a string model")
        assert doc is not None
        return Admitted(routeClass, engine.normalize(model), doc)
    if routeClass is RouteClass.VERBATIM and body:
        model = bodyModel(body)
        return Admitted(routeClass, engine.normalize(model) if model is not None else None)
    return Admitted(routeClass, None)
