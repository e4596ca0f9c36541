"""The queue's book of clients (spec §11 "The queue"): the declared clients in force, who a
request's client is by them, and what the queue did per client label, as ``/metrics`` and
``/status`` show it.  Pure.

Labels are a bounded set: the declared clients' names, ``unverified`` (every request no
declared key matches) and ``other`` (what was counted for a name a reload has since
removed: its counts move there, so totals never go back and the set stays bounded).
"""

from __future__ import annotations

from collections.abc import Sequence

from nvpair.proxy.flow.clients import (
    NO_CLIENTS,
    OTHER,
    RESERVED_NAMES,
    Client,
    DeclaredClient,
    Roster,
    clientKey,
)
from nvpair.proxy.flow.interfaces import QueueRefusal
from nvpair.proxy.routing.facts import Identity

__all__ = ["ClientBook"]


class ClientBook:
    """The declared clients (``roster``) and, per facade and client label, requests
    dispatched (waited or not) and refused by reason (``QueueRefusal``)."""

    def __init__(self) -> None:
        self.roster = NO_CLIENTS
        self.dispatched: dict[tuple[str, str], int] = {}
        self.refused: dict[tuple[str, str, QueueRefusal], int] = {}

    def clientOf(self, authorization: bytes | None, identity: Identity) -> Client:
        """The request's client (``flow.clients.clientKey``) with the declared clients in
        force; peer requests are served on the local backend, never queued: no peer id."""
        return clientKey(authorization, identity, self.roster)

    def setClients(self, clients: Sequence[DeclaredClient]) -> None:
        """The declared clients are now ``clients`` (the fleet file, at start and on every
        applied reload); counts of names no longer declared go to ``other``.  Requests
        already waiting keep the share they came with."""
        roster = self.roster = Roster(clients)
        dispatched: dict[tuple[str, str], int] = {}
        for (engine, label), count in self.dispatched.items():
            key = (engine, _kept(label, roster))
            dispatched[key] = dispatched.get(key, 0) + count
        self.dispatched = dispatched
        refused: dict[tuple[str, str, QueueRefusal], int] = {}
        for (engine, label, reason), count in self.refused.items():
            rkey = (engine, _kept(label, roster), reason)
            refused[rkey] = refused.get(rkey, 0) + count
        self.refused = refused

    def countDispatch(self, engine: str, client: Client) -> None:
        """One request of ``client`` went to the engines through facade ``engine``."""
        key = (engine, self.roster.label(client.share))
        self.dispatched[key] = self.dispatched.get(key, 0) + 1

    def countRefusal(self, engine: str, client: Client, reason: QueueRefusal) -> None:
        """The queue answered one request of ``client`` with ``reason``."""
        key = (engine, self.roster.label(client.share), reason)
        self.refused[key] = self.refused.get(key, 0) + 1


def _kept(label: str, roster: Roster) -> str:
    """``label`` if it still names something (a declared name, or a fixed label)."""
    return label if label in roster.names or label in RESERVED_NAMES else OTHER
