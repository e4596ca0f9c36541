"""Fleet-wide views: merged model lists and multi-target preflights (placeholder)."""

from __future__ import annotations

from typing import Any

from nvpair.proxy import inventory


class Fleet:
    """Answers fleet model lists and preflights for a facade."""

    def __init__(self, context: Any) -> None:
        self.context = context

    def modelList(self, facade: Any, request: Any) -> None:
        body = inventory.emptyEnvelope(request.path.decode("latin-1"))
        request.setHeader(b"content-type", b"application/json")
        request.write(body)
        request.finish()

    def preflight(self, facade: Any, request: Any) -> None:
        self.context.sendError(request, facade.engine, 502, "upstream_unreachable",
                               "no responder")
