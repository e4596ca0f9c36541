"""A request the HTTP layer refuses: a leaf (no parser, no reactor), so that the seams in
``http.interfaces`` name it without loading the request rules and llhttp."""

from __future__ import annotations


class Refusal(Exception):
    """A request the facade answers with ``status`` (400, 431, 501 or 505) and a close."""

    def __init__(self, status: int, message: str, path: bytes = b"/") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.path = path
