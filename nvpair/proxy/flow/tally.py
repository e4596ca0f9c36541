"""What the queue did per client, as ``/metrics`` and ``/status`` show it (spec §11 "The
queue", "Seen"): dispatches and refusals per facade and client label.  Pure.

Labels are a bounded set: the declared clients' names, ``unverified`` (every request no
declared key matches) and ``other`` (what was counted for a name a reload has since
removed: its counts move there, so totals never go back and the set stays bounded).
"""

from __future__ import annotations

from nvpair.proxy.flow.clients import NO_CLIENTS, OTHER, RESERVED_NAMES, Client, Roster

__all__ = ["ClientTally"]


class ClientTally:
    """Per facade and client label: requests dispatched (waited or not) and refused by
    reason (``queue_full``, ``queue_timeout``, ``deadline_exceeded``)."""

    def __init__(self) -> None:
        self.roster = NO_CLIENTS
        self.dispatched: dict[tuple[str, str], int] = {}
        self.refused: dict[tuple[str, str, str], int] = {}

    def countDispatch(self, engine: str, client: Client) -> None:
        """One request of ``client`` went to the engines through facade ``engine``."""
        key = (engine, self.roster.label(client.share))
        self.dispatched[key] = self.dispatched.get(key, 0) + 1

    def countRefusal(self, engine: str, client: Client, reason: str) -> None:
        """The queue answered one request of ``client`` with ``reason``."""
        key = (engine, self.roster.label(client.share), reason)
        self.refused[key] = self.refused.get(key, 0) + 1

    def relabel(self, roster: Roster) -> None:
        """The declared clients changed: counts of names no longer declared go to
        ``other``."""
        self.roster = roster
        dispatched: dict[tuple[str, str], int] = {}
        for (engine, label), count in self.dispatched.items():
            key = (engine, _kept(label, roster))
            dispatched[key] = dispatched.get(key, 0) + count
        self.dispatched = dispatched
        refused: dict[tuple[str, str, str], int] = {}
        for (engine, label, reason), count in self.refused.items():
            rkey = (engine, _kept(label, roster), reason)
            refused[rkey] = refused.get(rkey, 0) + count
        self.refused = refused


def _kept(label: str, roster: Roster) -> str:
    """``label`` if it still names something (a declared name, or a fixed label)."""
    return label if label in roster.names or label in RESERVED_NAMES else OTHER
