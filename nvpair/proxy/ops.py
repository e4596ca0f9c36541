"""The loopback operations listener (placeholder until metrics and status land)."""

from __future__ import annotations

from typing import Any


def startOps(service: Any, port: int) -> None:
    """Start the operations listener on 127.0.0.1:``port``."""
