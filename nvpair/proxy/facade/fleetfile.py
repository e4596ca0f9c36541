"""The standalone fleet file (protocol §9): TOML read with ``tomllib``, validated whole.

A pure parser: bytes in, a ``FleetSpec`` or a ``FleetError`` out, never another
exception.  A ``FleetError`` names the file, the line and the problem in one line
(``FILE:LINE: problem``), as the process prints it at start, ``--check-fleet`` prints it,
and a refused reload logs and shows it.  ``tomllib`` gives positions only for syntax
errors, so the line of a semantic error is found in the text: the line of the offending
key inside its ``[[backend]]`` (or ``[[client]]``) table, else the table's header line.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import TypeVar
from urllib.parse import urlsplit

import attrs

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.facade.fleetclients import ClientProblem, parseClients
from nvpair.proxy.facade.fleetread import readRegularFile
from nvpair.proxy.flow.clients import DeclaredClient

MAX_FILE_BYTES = 1024 * 1024
MAX_BACKENDS = 1024
MAX_CONCURRENCY = 4096
MAX_NAME = 64
MAX_PRELOAD = 64  # models named in one backend's preload
MAX_MODEL_NAME = 512

_T = TypeVar("_T")

_TOP_KEYS = ("engines", "backend", "client", "share_prefixes")
_BACKEND_KEYS = ("engine", "url", "name", "max_concurrency", "enabled", "preload", "unload_idle")
_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)|\(at end of document\)")
_HEADER = re.compile(r"^\s*\[\[\s*(backend|client)\s*\]\]\s*(#.*)?$")
_ANY_HEADER = re.compile(r"^\s*\[")


class FleetError(ValueError):
    """A fleet file that cannot be used; ``str()`` is the one line ``FILE:LINE: problem``
    (``FILE: problem`` when it could not be read at all, ``line`` 0)."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        # line 0: the file as a whole (it could not be read)
        super().__init__(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


@attrs.frozen
class Backend:
    """One engine of the fleet: its node id is its URL; the rest is what the file says."""

    engine: str
    url: str
    name: str | None = None
    maxConcurrency: int | None = None
    """Slots for an engine that reports none (placement and the queue read it)."""
    enabled: bool = True
    preload: tuple[str, ...] = ()
    """Models to load through the engine's own API at start and after every reload."""
    unloadIdle: bool = False
    """Whether the proxy may unload an idle model there to make room for another."""


@attrs.frozen
class FleetSpec:
    """A validated fleet: the facades to enable, every backend and every declared client,
    in file order."""

    engines: tuple[str, ...]
    backends: tuple[Backend, ...]
    clients: tuple[DeclaredClient, ...] = ()
    sharePrefixes: bool = False
    """Requests with different ``Authorization`` values share prefix placement."""

    def serving(self, engineId: str) -> tuple[Backend, ...]:
        """The enabled backends of one engine, in file order; an engine with no
        ``[[backend]]`` entry at all gets one node at its default address (as with
        ``--backend``), one whose entries are all disabled gets none."""
        listed = [b for b in self.backends if b.engine == engineId]
        if not listed:
            return (Backend(engineId, ENGINES[engineId].defaultBackend),)
        return tuple(b for b in listed if b.enabled)

    def summary(self) -> str:
        """One line for ``--check-fleet``: what would run."""
        parts = []
        for engineId in self.engines:
            serving = self.serving(engineId)
            parts.append(f"{engineId}: {len(serving)} backend{'' if len(serving) == 1 else 's'}")
        disabled = sum(1 for b in self.backends if not b.enabled)
        tail = f" ({disabled} disabled)" if disabled else ""
        if self.clients:
            named = ", ".join(
                c.name if c.weight == 1 else f"{c.name} (weight {c.weight:g})" for c in self.clients
            )
            tail += f"; clients: {named}"
        return f"fleet OK: {', '.join(parts)}{tail}"


def normalizeUrl(url: str) -> str:
    """A backend URL as a node id: surrounding blanks and trailing slashes dropped (the
    same rule as ``--backend``)."""
    return url.strip().rstrip("/")


def urlProblem(url: str) -> str | None:
    """Why ``url`` (normalised) cannot be a backend address, or None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"url {url!r} is not a valid URL ({e})"
    if parts.scheme != "http":
        return f"url {url!r} must start with http:// (engines are reached over plain HTTP)"
    if not parts.hostname:
        return f"url {url!r} has no host"
    if parts.username is not None or parts.password is not None:
        return f"url {url!r} must not carry credentials"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return f"url {url!r} must not have a query or fragment"
    if port == 0:
        return f"url {url!r} has port 0"
    return None


class _Lines:
    """Finds the line of a key or of the n-th ``[[backend]]`` (or ``[[client]]``) table in
    the file's text."""

    def __init__(self, text: str) -> None:
        self.lines = [line.rstrip("\r") for line in text.split("\n")]  # TOML's newlines
        self.headers: dict[str, list[int]] = {"backend": [], "client": []}
        for i, line in enumerate(self.lines):
            match = _HEADER.match(line)
            if match is not None:
                self.headers[match.group(1)].append(i + 1)

    def _key(self, key: str, start: int, end: int) -> int | None:
        pattern = re.compile(
            rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*="
        )
        for number in range(start, min(end, len(self.lines)) + 1):
            if pattern.match(self.lines[number - 1]):
                return number
        return None

    def top(self, key: str) -> int:
        """The line of top-level ``key`` (before any table), else 1."""
        end = next(
            (i for i, line in enumerate(self.lines) if _ANY_HEADER.match(line)), len(self.lines)
        )
        return self._key(key, 1, end) or 1

    def backend(self, index: int, key: str | None = None) -> int:
        """The line of ``key`` in the ``index``-th backend table, else its header line."""
        return self.table("backend", index, key)

    def table(self, name: str, index: int, key: str | None = None) -> int:
        """The line of ``key`` in the ``index``-th ``[[name]]`` table, else its header."""
        headers = self.headers[name]
        if index >= len(headers):
            return self.top(name)  # an inline array of tables, or dotted keys
        start = headers[index]
        end = len(self.lines)
        for number in range(start + 1, end + 1):  # a later [table] ends this one
            if _ANY_HEADER.match(self.lines[number - 1]):
                end = number - 1
                break
        if key is not None:
            found = self._key(key, start + 1, end)
            if found is not None:
                return found
        return start


def parseFleet(data: bytes, path: str) -> FleetSpec:
    """Validate a fleet file's bytes; raises ``FleetError`` naming ``path`` and a line."""
    if len(data) > MAX_FILE_BYTES:
        raise FleetError(path, 1, f"file is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FleetError(path, data.count(b"\n", 0, e.start) + 1, "not UTF-8 text") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        match = _TOML_POSITION.search(message)
        if match is None or match.group(1) is None:
            line = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
        else:
            line = int(match.group(1))
        problem = _TOML_POSITION.sub("", message).strip()
        raise FleetError(path, line, f"invalid TOML: {problem}") from None
    return _validate(document, _Lines(text), path)


def _validate(document: Mapping[str, object], lines: _Lines, path: str) -> FleetSpec:
    for key in document:
        if key not in _TOP_KEYS:
            raise FleetError(
                path, lines.top(key), f"unknown key {key!r} (allowed: {', '.join(_TOP_KEYS)})"
            )
    engines = _engines(document.get("engines"), lines, path)
    raw = document.get("backend", [])
    if not isinstance(raw, list):
        raise FleetError(
            path, lines.top("backend"), "backend must be an array of [[backend]] tables"
        )
    if len(raw) > MAX_BACKENDS:
        raise FleetError(path, lines.backend(MAX_BACKENDS), f"more than {MAX_BACKENDS} backends")
    backends = tuple(_backend(entry, i, lines, path) for i, entry in enumerate(raw))
    seen: dict[str, dict[str, int]] = {"url": {}, "name": {}}
    for i, b in enumerate(backends):
        for key, value in (("url", b.url), ("name", b.name)):
            first = i if value is None else seen[key].setdefault(value, i)
            if first != i:
                raise FleetError(
                    path,
                    lines.backend(i, key),
                    f"duplicate {key} {value!r} (already backend #{first + 1})",
                )
    if engines is None:
        engines = tuple(dict.fromkeys(b.engine for b in backends))
        if not engines:
            raise FleetError(path, 1, "empty fleet: no [[backend]] and no engines")
    else:
        for i, b in enumerate(backends):
            if b.engine not in engines:
                raise FleetError(
                    path,
                    lines.backend(i, "engine"),
                    f"engine {b.engine!r} is not in the top-level engines list",
                )
    try:
        clients = parseClients(document.get("client", []))
    except ClientProblem as e:
        line = lines.top("client") if e.index is None else lines.table("client", e.index, e.key)
        raise FleetError(path, line, e.problem) from None
    share = document.get("share_prefixes", False)
    if not isinstance(share, bool):
        raise FleetError(path, lines.top("share_prefixes"), "share_prefixes must be true or false")
    return FleetSpec(engines, backends, clients, share)


def _engines(value: object, lines: _Lines, path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    line = lines.top("engines")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FleetError(path, line, "engines must be a list of engine names")
    if not value:
        raise FleetError(
            path, line, "engines is empty (leave it out to enable those with a backend)"
        )
    for name in value:
        if name not in ENGINES:
            raise FleetError(path, line, f"unknown engine {name!r} (one of {', '.join(ENGINES)})")
    if len(set(value)) != len(value):
        raise FleetError(path, line, "engines lists an engine twice")
    return tuple(value)


def _backend(entry: object, i: int, lines: _Lines, path: str) -> Backend:
    if not isinstance(entry, Mapping):
        raise FleetError(path, lines.backend(i), f"backend #{i + 1} must be a table")
    for key in entry:
        if key not in _BACKEND_KEYS:
            raise FleetError(
                path,
                lines.backend(i, key),
                f"unknown key {key!r} in [[backend]] (allowed: {', '.join(_BACKEND_KEYS)})",
            )
    for key in ("engine", "url"):
        if key not in entry:
            raise FleetError(path, lines.backend(i), f"backend #{i + 1} has no {key}")
    engine = _typed(entry, "engine", str, i, lines, path)
    if engine not in ENGINES:
        raise FleetError(
            path,
            lines.backend(i, "engine"),
            f"unknown engine {engine!r} (one of {', '.join(ENGINES)})",
        )
    url = normalizeUrl(_typed(entry, "url", str, i, lines, path))
    problem = urlProblem(url)
    if problem is not None:
        raise FleetError(path, lines.backend(i, "url"), problem)
    name = entry.get("name")
    if name is not None:
        name = _typed(entry, "name", str, i, lines, path)
        if not name.strip() or len(name) > MAX_NAME or not name.isprintable():
            raise FleetError(
                path,
                lines.backend(i, "name"),
                f"name must be 1 to {MAX_NAME} printable characters",
            )
    limit = entry.get("max_concurrency")
    if limit is not None:
        limit = _typed(entry, "max_concurrency", int, i, lines, path)
        if not 1 <= limit <= MAX_CONCURRENCY:
            raise FleetError(
                path,
                lines.backend(i, "max_concurrency"),
                f"max_concurrency must be 1 to {MAX_CONCURRENCY}",
            )
    enabled = _typed(entry, "enabled", bool, i, lines, path) if "enabled" in entry else True
    preload = _preload(entry, i, lines, path)
    unload = _typed(entry, "unload_idle", bool, i, lines, path) if "unload_idle" in entry else False
    return Backend(engine, url, name, limit, enabled, preload, unload)


def _preload(entry: Mapping[str, object], i: int, lines: _Lines, path: str) -> tuple[str, ...]:
    """``preload``: a list of distinct model names (protocol §9)."""
    value = entry.get("preload", [])
    line = lines.backend(i, "preload")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FleetError(path, line, "preload must be a list of model names")
    if len(value) > MAX_PRELOAD:
        raise FleetError(path, line, f"preload names more than {MAX_PRELOAD} models")
    for name in value:
        if not name.strip() or len(name) > MAX_MODEL_NAME or not name.isprintable():
            raise FleetError(
                path, line, f"preload names must be 1 to {MAX_MODEL_NAME} printable characters"
            )
    if len(set(value)) != len(value):
        raise FleetError(path, line, "preload names a model twice")
    return tuple(value)


def _typed(
    entry: Mapping[str, object],
    key: str,
    kind: type[_T],
    i: int,
    lines: _Lines,
    path: str,
    table: str = "backend",
) -> _T:
    value = entry[key]
    # bool is an int to Python, never to the file
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = {str: "a string", int: "an integer", bool: "true or false"}
        raise FleetError(path, lines.table(table, i, key), f"{key} must be {names.get(kind, kind)}")
    return value


def loadFleet(path: str) -> FleetSpec:
    """Read and validate the fleet file at ``path`` (a small regular file: read at once,
    never blocking on a pipe or device, ``fleetread``)."""
    try:
        data = readRegularFile(path, MAX_FILE_BYTES + 1)
    except OSError as e:
        raise FleetError(path, 0, f"cannot read: {e.strerror or e}") from None
    return parseFleet(data, path)
