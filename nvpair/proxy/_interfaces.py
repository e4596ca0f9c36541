"""The seams that tests fake: the broker sink, the message handler, the upstream connector."""

from __future__ import annotations

from typing import Any

from zope.interface import Attribute, Interface


class IBrokerSink(Interface):
    """Where notifications to the broker go (stdout in production, a list in tests)."""

    def notify(method: str, params: dict[str, Any]) -> None:
        """Emit one JSON-RPC notification."""


class IMessageHandler(Interface):
    """What the broker channel calls for every well-formed message."""

    def handle(engine: str | None, name: str, params: dict[str, Any]) -> object:
        """Handle ``name`` (addressed to ``engine`` or unaddressed); return a result or a
        Deferred of one, or raise ``RPCError``."""


class IUpstream(Interface):
    """Opens one HTTP exchange with a node: the seam between dispatch and the network."""

    def request(
        node: Any, address: str | None, method: bytes, path: bytes, headers: Any, body: bytes
    ) -> Any:
        """Return a Deferred firing with an ``IResponse`` from that node."""


class IDiscoveryView(Interface):
    """A facade's live discovery snapshot, as dispatch sees it."""

    snapshot = Attribute("The current candidates.Snapshot")
    hasLocalBackend = Attribute("Whether a local backend is set")

    def nextSnapshot() -> Any:
        """A Deferred that fires when the next snapshot is applied."""
