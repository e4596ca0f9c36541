"""A log observer that keeps every event (patch a class's ``Logger`` with one)."""

from __future__ import annotations

from typing import Any

from twisted.logger import ILogObserver
from zope.interface import implementer


@implementer(ILogObserver)
class Events(list[dict[str, Any]]):
    """A log observer keeping every event it sees."""

    def __call__(self, event: dict[str, Any]) -> None:
        self.append(event)
