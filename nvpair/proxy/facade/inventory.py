"""Model-list parsing and the fleet merge of protocol §11.

Ollama's ``/api/tags`` is ``{"models": [...]}`` keyed by ``name``; every other fleet list
route (OpenAI style) is ``{"object": "list", "data": [...]}`` keyed by ``id``.  llama.cpp's
``/models`` carries both ``models`` and ``data``; it is read, like the rest, by ``data``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class InvalidList(ValueError):
    """A node answered a model list that is not the engine's list envelope."""


def listKey(path: str) -> tuple[str, str]:
    """The (list field, entry id field) of the model list served at ``path``."""
    if path.split("?", 1)[0] == "/api/tags":
        return ("models", "name")
    return ("data", "id")


def parseList(path: str, body: bytes) -> list[dict[str, object]]:
    """The entries of a model list body; raises InvalidList if it is not a valid list."""
    field, idField = listKey(path)
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise InvalidList(f"model list is not JSON ({type(e).__name__})") from None
    if not isinstance(document, dict):
        raise InvalidList("model list is not a JSON object")
    entries = document.get(field)
    if not isinstance(entries, list):
        raise InvalidList(f"model list has no {field!r} array")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidList(f"model list entry {index} is not an object")
        if not isinstance(entry.get(idField), str):
            raise InvalidList(f"model list entry {index} has no string {idField!r}")
    return entries


def _envelope(path: str, entries: list[dict[str, object]]) -> bytes:
    """The engine's list envelope around ``entries``."""
    field, _ = listKey(path)
    document: dict[str, object] = {field: entries}
    if field == "data":
        document = {"object": "list", "data": entries}
    return _encoder.encode(document).encode("utf-8")


def mergeLists(path: str, bodies: Sequence[bytes]) -> bytes:
    """Merge the nodes' lists (in candidate order) by id, first seen wins, into one envelope.

    Raises InvalidList if any body is invalid: no partial list is ever produced.
    """
    _, idField = listKey(path)
    merged: list[dict[str, object]] = []
    seen: set[object] = set()
    for body in bodies:
        for entry in parseList(path, body):
            ident = entry[idField]
            if ident not in seen:
                seen.add(ident)
                merged.append(entry)
    return _envelope(path, merged)


def emptyEnvelope(path: str) -> bytes:
    """The engine's empty list envelope for ``path`` (a fleet with no nodes)."""
    return _envelope(path, [])


def modelNames(path: str, body: bytes) -> list[str]:
    """The model ids (or Ollama names) a list advertises, in order; raises InvalidList."""
    _, idField = listKey(path)
    return [str(entry[idField]) for entry in parseList(path, body)]
