"""Who a queued request belongs to (spec §11 "The queue"): the client key fair queueing
shares service by.  Pure; the key is a digest, so neither a credential nor a user name is
ever held, logged or shown."""

from __future__ import annotations

import hashlib

__all__ = ["LOCAL", "MAX_USER_LENGTH", "clientKey"]

LOCAL = "local"
MAX_USER_LENGTH = 256


def _digest(kind: bytes, value: bytes) -> str:
    return hashlib.blake2b(kind + b"\0" + value, digest_size=8).hexdigest()


def clientKey(
    authorization: bytes | None, document: dict[str, object] | None, peerId: str | None
) -> str:
    """The client key, in order: a digest of the ``Authorization`` value; a digest of the
    OpenAI ``user`` body field (a non-empty string of at most ``MAX_USER_LENGTH``
    characters); the cluster peer's node id; else ``"local"``."""
    if authorization:
        return "a:" + _digest(b"authorization", authorization)
    if document is not None:
        user = document.get("user")
        if isinstance(user, str) and 0 < len(user) <= MAX_USER_LENGTH:
            return "u:" + _digest(b"user", user.encode("utf-8", "surrogatepass"))
    if peerId is not None:
        return "p:" + peerId
    return LOCAL
