"""Requests from pinned cluster peers (placeholder until the cluster personality lands)."""

from __future__ import annotations

from typing import Any


class PeerDoor:
    """Serves a pinned peer's request from the facade's local backend."""

    def __init__(self, context: Any, facade: Any) -> None:
        self.context = context
        self.facade = facade

    def handle(self, request: Any) -> None:
        self.context.sendError(request, self.facade.engine, 502, "upstream_unreachable",
                               "no local backend")

    def crashed(self, request: Any, error: Exception) -> None:
        self.context.reportInternal(type(error).__name__)
