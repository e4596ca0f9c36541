"""The refusal of a request by the HTTP layer: a leaf that imports nothing.

``Refusal`` is what the request reader and the rules raise and queue, and what the
interfaces name (``IServerChannel.queue``), so it lives apart from the parser: importing
the interfaces loads no ``httptools``.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request the facade answers with ``status`` (400, 431, 501 or 505) and a close."""

    def __init__(self, status: int, message: str, path: bytes = b"/") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.path = path
