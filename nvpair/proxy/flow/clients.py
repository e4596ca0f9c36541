"""Who a queued request belongs to (protocol §9's client rule; spec §11 "The queue"): the
client fair queueing shares service by.  Pure.

A request is a declared client's when the SHA-256 of its whole ``Authorization`` value is
one the fleet file declares (``[[client]]``): that client has a share of its own, named.
Every other request is *unverified*: it shares one share with all the others, and inside
it is told apart, in order, by a digest of its ``Authorization`` value, Anthropic
``metadata.user_id``, OpenAI ``safety_identifier``, OpenAI ``user``, the cluster peer's node
id, else ``local``.  Keys are digests, so neither a credential nor a user name is ever held,
logged or shown; declared names are the operator's and may be shown.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import attrs

from nvpair.proxy.routing.facts import Identity

__all__ = [
    "LOCAL",
    "OTHER",
    "UNVERIFIED",
    "Client",
    "DeclaredClient",
    "Roster",
    "clientKey",
]

LOCAL = "local"
UNVERIFIED = "unverified"
"""The share (and the metric label) of every request no declared client's key matches."""
OTHER = "other"
"""The metric label of what was counted for a declared name a reload has since removed."""
RESERVED_NAMES = (UNVERIFIED, OTHER)


@attrs.frozen
class DeclaredClient:
    """One ``[[client]]`` of the fleet file: its name, the SHA-256 (lower-case hex) of its
    whole ``Authorization`` value, and its weight (its share's service per dispatch is
    ``1 / weight``)."""

    name: str
    keySha256: str
    weight: float = 1.0


@attrs.frozen
class Client:
    """A request's client for the fair queue: ``key`` tells it apart (``d:NAME`` for a
    declared client, else a digest), ``share`` is the declared name or None (the unverified
    share), ``weight`` its share's weight."""

    key: str
    share: str | None = None
    weight: float = 1.0

    @property
    def label(self) -> str:
        """The share's name as metrics and ``/status`` show it."""
        return UNVERIFIED if self.share is None else self.share


class Roster:
    """The declared clients in force, by the SHA-256 of their key (empty: none declared)."""

    def __init__(self, clients: Iterable[DeclaredClient] = ()) -> None:
        self.byKey: Mapping[str, DeclaredClient] = {c.keySha256: c for c in clients}
        self.names = frozenset(c.name for c in self.byKey.values())

    def __len__(self) -> int:
        return len(self.byKey)

    def match(self, authorization: bytes) -> DeclaredClient | None:
        """The declared client whose key is ``authorization`` (the whole header value)."""
        if not self.byKey:
            return None
        return self.byKey.get(hashlib.sha256(authorization).hexdigest())

    def label(self, share: str | None) -> str:
        """The metric label of ``share``: its name while declared, ``unverified`` for the
        unverified share, ``other`` for a name no longer declared (the set stays bounded)."""
        if share is None:
            return UNVERIFIED
        return share if share in self.names else OTHER


NO_CLIENTS = Roster()
_LOCAL_CLIENT = Client(LOCAL)  # frozen: every request that names nobody shares it


def _digest(kind: bytes, value: bytes) -> str:
    return hashlib.blake2b(kind + b"\0" + value, digest_size=8).hexdigest()


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def clientKey(
    authorization: bytes | None,
    identity: Identity,
    roster: Roster = NO_CLIENTS,
    peerId: str | None = None,
) -> Client:
    """The request's client, in protocol §9's order: a declared client matched by its key;
    else (unverified) ``a:`` and a 64-bit BLAKE2b digest of the ``Authorization`` value;
    ``m:`` and a digest of Anthropic ``metadata.user_id``; ``s:`` and one of OpenAI
    ``safety_identifier``; ``u:`` and one of OpenAI ``user``; ``p:`` and the peer's node id;
    else ``local``.  ``identity``'s fields are already bounded (``routing.facts``)."""
    if authorization:
        declared = roster.match(authorization)
        if declared is not None:
            return Client("d:" + declared.name, declared.name, declared.weight)
        return Client("a:" + _digest(b"authorization", authorization))
    for prefix, kind, value in (
        ("m:", b"anthropic-user", identity.anthropicUser),
        ("s:", b"safety-identifier", identity.safetyIdentifier),
        ("u:", b"user", identity.user),
    ):
        if value:
            return Client(prefix + _digest(kind, _text(value)))
    if peerId is not None:
        return Client("p:" + peerId)
    return _LOCAL_CLIENT
