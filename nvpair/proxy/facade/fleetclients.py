"""The fleet file's ``[[client]]`` tables (protocol §9; spec §11 "The fleet file", "The
queue"): the clients an operator declares, each with a fair share of its own.  Pure: the
parsed TOML value in, ``DeclaredClient`` values or a ``ClientProblem`` out (``fleetfile``
turns it into a ``FleetError`` with the line).  A key's digest is never echoed in a
problem: a value pasted by mistake may be the key itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from nvpair.proxy.flow.clients import RESERVED_NAMES, DeclaredClient

__all__ = ["MAX_CLIENTS", "MAX_WEIGHT", "MIN_WEIGHT", "ClientProblem", "parseClients"]

MAX_CLIENTS = 256
MAX_NAME = 64
MIN_WEIGHT = 0.01
MAX_WEIGHT = 100.0
KEYS = ("name", "key_sha256", "weight")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class ClientProblem(ValueError):
    """Why the ``[[client]]`` tables cannot be used: the table's index (None: the
    ``client`` key itself), the offending key if any, and the problem."""

    def __init__(self, index: int | None, key: str | None, problem: str) -> None:
        super().__init__(problem)
        self.index = index
        self.key = key
        self.problem = problem


def parseClients(raw: object) -> tuple[DeclaredClient, ...]:
    """The declared clients, in file order: names and keys each once, at most
    ``MAX_CLIENTS``; raises ``ClientProblem``."""
    if not isinstance(raw, list):
        raise ClientProblem(None, None, "client must be an array of [[client]] tables")
    if len(raw) > MAX_CLIENTS:
        raise ClientProblem(MAX_CLIENTS, None, f"more than {MAX_CLIENTS} clients")
    clients = tuple(_client(entry, i) for i, entry in enumerate(raw))
    seen: dict[str, dict[str, int]] = {"name": {}, "key_sha256": {}}
    for i, c in enumerate(clients):
        for key, value in (("name", c.name), ("key_sha256", c.keySha256)):
            first = seen[key].setdefault(value, i)
            if first != i:
                shown = repr(value) if key == "name" else "(the same key)"
                raise ClientProblem(
                    i, key, f"duplicate {key} {shown} (already client #{first + 1})"
                )
    return clients


def _client(entry: object, i: int) -> DeclaredClient:
    if not isinstance(entry, Mapping):
        raise ClientProblem(i, None, f"client #{i + 1} must be a table")
    for key in entry:
        if key not in KEYS:
            raise ClientProblem(
                i, key, f"unknown key {key!r} in [[client]] (allowed: {', '.join(KEYS)})"
            )
    for key in ("name", "key_sha256"):
        if key not in entry:
            raise ClientProblem(i, None, f"client #{i + 1} has no {key}")
    name = entry["name"]
    if not isinstance(name, str):
        raise ClientProblem(i, "name", "name must be a string")
    if not name.strip() or len(name) > MAX_NAME or not name.isprintable():
        raise ClientProblem(i, "name", f"name must be 1 to {MAX_NAME} printable characters")
    if name in RESERVED_NAMES:
        raise ClientProblem(i, "name", f"name {name!r} is reserved (a metric label)")
    digest = entry["key_sha256"]
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise ClientProblem(
            i,
            "key_sha256",
            "key_sha256 must be 64 hex digits: the SHA-256 of the whole Authorization "
            'value (printf %s "Bearer sk-..." | sha256sum)',
        )
    weight = entry.get("weight", 1)
    if not isinstance(weight, int | float) or isinstance(weight, bool):
        raise ClientProblem(i, "weight", "weight must be a number")
    if not (math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT):
        raise ClientProblem(i, "weight", f"weight must be {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
    return DeclaredClient(name, digest.lower(), float(weight))
