"""Admission (spec §5 step 1, protocol §11): what a request is and whether it may go on.

Pure code: route class, the model a body names, the fields routing acts on
(``facts.RequestFacts``), and the refusals (400) that need no engine.  The body limit (413)
is enforced while the body is read, in ``site``.

A body is read in bounded reactor time (spec §5 "Bodies"): one of at most ``PARSE_LIMIT``
bytes and ``MAX_VALUES`` separators is parsed whole, a larger one is only scanned at both
ends for its top-level fields (``bodyscan``).  The parsed document never outlives
admission: where the caller asks for them (``keyer``), the prompt's digests are taken from
it here, and the request carries those, never the document.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Generic, TypeVar, overload

import attrs

from nvpair.proxy.engines import Engine, RouteClass
from nvpair.proxy.routing.bodyscan import WINDOW, scanMembers
from nvpair.proxy.routing.facts import MAX_FIELD, NO_FACTS, NO_IDENTITY, Identity, RequestFacts

__all__ = [
    "MAX_MODEL",
    "MAX_VALUES",
    "PARSE_LIMIT",
    "Admitted",
    "Refused",
    "admit",
    "bodyDocument",
    "factsOf",
    "readBody",
]

PARSE_LIMIT = 8 * 1024 * 1024  # bytes of a body parsed whole, at most
MAX_VALUES = 1 << 18  # commas and opening brackets of a body parsed whole, at most
MAX_MODEL = 512  # characters of a model name, at most
# The top-level fields read from a body (all that a scanned body is read for).
FIELDS = frozenset(
    (
        *("model", "stream", "user", "safety_identifier", "metadata"),
        *("previous_response_id", "prompt_cache_key", "cache_prompt"),
    )
)

# Those ``factsOf`` reads (a body naming none of them has ``NO_FACTS``), and who it says.
_FACT_FIELDS = FIELDS - {"model"}
_IDENTITY_FIELDS = frozenset(("metadata", "safety_identifier", "user"))

K = TypeVar("K")


@attrs.frozen
class Admitted(Generic[K]):
    """A request that may be routed: its class, its normalized model when it names one, the
    fields of its body routing acts on, and its prompt's digests where they were asked for
    and the body was parsed whole."""

    routeClass: RouteClass
    model: str | None
    facts: RequestFacts = NO_FACTS
    prefixKey: K | None = attrs.field(default=None, eq=False, repr=False)
    """What the caller's ``keyer`` made of the parsed body (digests, never text)."""


@attrs.frozen
class Refused:
    """A request answered by the proxy at admission."""

    status: int
    reason: str
    message: str


_decoder = json.JSONDecoder()
_NO_MODEL = "the body must be a JSON object with a string model"
_NO_MODEL_SCANNED = (
    "the body must be a JSON object with a string model (a body this large is read only "
    f"in its first and last {WINDOW >> 10} KiB)"
)
_LONG_MODEL = f"the model name is longer than {MAX_MODEL} characters"


def bodyDocument(body: bytes) -> dict[str, object] | None:
    """The body parsed as a JSON object, or None when it is not one."""
    stripped = body.lstrip()
    if not stripped.startswith(b"{"):
        return None
    return _document(stripped)


def _document(stripped: bytes) -> dict[str, object] | None:
    """``bodyDocument`` of a body already stripped, known to start with ``{``."""
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


def readBody(body: bytes) -> tuple[dict[str, object] | None, bool]:
    """(fields, whole): the body's JSON object parsed whole when it is small enough, else
    its top-level ``FIELDS`` found by a bounded scan; None when it is not a JSON object."""
    if len(body) <= PARSE_LIMIT:
        stripped = body.lstrip()
        if not stripped.startswith(b"{"):
            return None, True
        if stripped.count(b",") + stripped.count(b"[") + stripped.count(b"{") <= MAX_VALUES:
            return _document(stripped), True
    return scanMembers(body, FIELDS), False


def _text(value: object) -> str | None:
    return value if type(value) is str and 0 < len(value) <= MAX_FIELD else None


def _flag(value: object) -> bool | None:
    return value if type(value) is bool else None


def factsOf(fields: dict[str, object]) -> RequestFacts:
    """The fields of a body (parsed or scanned) that routing acts on, bounded."""
    names = fields.keys()
    if names.isdisjoint(_FACT_FIELDS):
        return NO_FACTS  # the common body: nothing to read, nothing to build
    identity = NO_IDENTITY
    if not names.isdisjoint(_IDENTITY_FIELDS):
        metadata = fields.get("metadata")
        said = (
            _text(metadata.get("user_id")) if type(metadata) is dict else None,
            _text(fields.get("safety_identifier")),
            _text(fields.get("user")),
        )
        if said != (None, None, None):
            identity = Identity(*said)
    return RequestFacts(
        identity,
        _text(fields.get("previous_response_id")),
        _text(fields.get("prompt_cache_key")),
        _flag(fields.get("cache_prompt")),
        _flag(fields.get("stream")),
    )


@overload
def admit(engine: Engine, method: bytes, path: bytes, body: bytes) -> Admitted[None] | Refused: ...


@overload
def admit(
    engine: Engine,
    method: bytes,
    path: bytes,
    body: bytes,
    keyer: Callable[[str, dict[str, object]], K | None] | None,
) -> Admitted[K] | Refused: ...


def admit(
    engine: Engine,
    method: bytes,
    path: bytes,
    body: bytes,
    keyer: Callable[[str, dict[str, object]], K | None] | None = None,
) -> Admitted[K] | Refused:
    """Classify a request, check an inference body names a model of bounded length, read
    its facts and, with a ``keyer``, its prompt's digests (``keyer(model, document)``)."""
    routeClass = engine.classify(method, path)
    if routeClass is RouteClass.INFERENCE or routeClass is RouteClass.MODEL_ROUTED:
        fields, whole = readBody(body)
        model = fields.get("model") if fields is not None else None
        if not isinstance(model, str):
            return Refused(400, "bad_request", _NO_MODEL if whole else _NO_MODEL_SCANNED)
        if len(model) > MAX_MODEL:
            return Refused(400, "bad_request", _LONG_MODEL)
        assert fields is not None
        normalized = engine.normalize(model)
        key = keyer(normalized, fields) if keyer is not None and whole else None
        return Admitted(routeClass, normalized, factsOf(fields), key)
    if routeClass is RouteClass.VERBATIM and body:
        fields, _ = readBody(body)
        model = fields.get("model") if fields is not None else None
        if isinstance(model, str) and len(model) <= MAX_MODEL:
            return Admitted(routeClass, engine.normalize(model))
        return Admitted(routeClass, None)  # an over-long model: no owner lookup
    return Admitted(routeClass, None)
