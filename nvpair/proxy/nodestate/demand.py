"""Recent demand for models, per node and over the fleet (spec §11, "Model residency").

Each request counts once when it begins; a count decays with a time constant of
``DEMAND_TAU`` seconds, read as requests per minute.  Bounded: at most ``bound`` models per
table, the one with the least demand given up first.
"""

from __future__ import annotations

import math

__all__ = ["DEMAND_TAU", "Demand"]

DEMAND_TAU = 60.0


class _Decay:
    __slots__ = ("value", "at")

    def __init__(self, at: float) -> None:
        self.value = 0.0
        self.at = at

    def now(self, now: float) -> float:
        return self.value * math.exp(-max(0.0, now - self.at) / DEMAND_TAU)


class Demand:
    """Decayed request counts per model, at most ``bound`` models."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._table: dict[str, _Decay] = {}

    def __len__(self) -> int:
        return len(self._table)

    def bump(self, model: str, now: float) -> None:
        """A request for ``model`` began at ``now``."""
        decay = self._table.get(model)
        if decay is None:
            if len(self._table) >= self.bound:
                del self._table[min(self._table, key=lambda m: self._table[m].now(now))]
            decay = self._table[model] = _Decay(now)
        elapsed = now - decay.at  # ``decay.now(now)`` written out: each request bumps two
        if elapsed > 0.0:
            decay.value *= math.exp(-elapsed / DEMAND_TAU)
        decay.value += 1.0
        decay.at = now

    def perMinute(self, model: str, now: float) -> float:
        """Requests per minute for ``model`` lately (0 when none)."""
        decay = self._table.get(model)
        return 0.0 if decay is None else decay.now(now) * 60.0 / DEMAND_TAU
