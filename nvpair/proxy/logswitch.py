"""The log level switch as the request path reads it (``ILogControl``): a leaf, so that the
process runtime that provides it (``runtime.logs.LogControl``) and the seams that name it
(``interfaces``) share it without the runtime importing any seam module."""

from __future__ import annotations

from zope.interface import Interface

__all__ = ["ILogControl"]


class ILogControl(Interface):
    """The process's log level switch, as code that skips debug-only work reads it
    (``runtime.logs.LogControl``)."""

    def enabled(level: str) -> bool:
        """Whether a record at ``level`` would be written (cheap)."""
