"""The seams that tests fake: the broker sink, the message handler, the upstream connector."""

from __future__ import annotations

from typing import Any

from zope.interface import Interface


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
        node: Any,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Any,
        body: bytes,
        connected: Any = None,
    ) -> Any:
        """Return a Deferred firing with an ``IResponse`` from that node; ``connected``, when
        given, is called once the connection is made (the header timer starts there)."""

