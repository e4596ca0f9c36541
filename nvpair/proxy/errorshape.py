"""How an engine shapes the error answers the proxy generates: a leaf interface, so that the
engine table (``engines``) provides it without importing the HTTP layer, and the HTTP layer
(``http.site``) consumes it without importing the engine table."""

from __future__ import annotations

from zope.interface import Interface


class IErrorShape(Interface):
    """How a facade's engine shapes the error answers the proxy generates."""

    def errorBody(path: bytes, reason: str, message: str) -> bytes:
        """The error document for a request to ``path``."""
