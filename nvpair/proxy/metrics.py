"""Request-path counters (placeholder until the operations listener lands)."""

from __future__ import annotations

from typing import Any


class Metrics:
    """Receives the request path's events; counts nothing yet."""

    def rpcMessage(self, name: str) -> None:
        pass

    def internalError(self) -> None:
        pass

    def attemptFailed(self, exchange: Any, outcome: Any) -> None:
        pass

    def committed(self, exchange: Any, nodeId: str, ttft: float) -> None:
        pass

    def requestEnded(self, exchange: Any) -> None:
        pass
