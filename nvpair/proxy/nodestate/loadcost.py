"""What loading a model costs, learnt per node and model (spec §11, "Model residency").

Three kinds of evidence, each a moving average (weight ``WEIGHT`` for the newest) kept per
(node, model), and read in this order of trust:

1. **reported**: the engine's own figure for a load: Ollama's ``load_duration`` (integer
   nanoseconds on a native answer; under ``MIN_LOAD_SECONDS`` the model was warm and it
   says nothing of a load), LM Studio's ``load_time_seconds``;
2. **transition**: llama.cpp router mode's status going ``loading`` → ``loaded`` between two
   probes (or from the moment the proxy asked for the load), at most a probe interval long;
3. **first byte**: the time to first byte of a request that found its model cold (an upper
   bound: it holds the prefill too).

Before anything is known of a (node, model): the mean of what the same model cost on the
other nodes, else the mean of what the node's other models cost, else
``DEFAULT_LOAD_SECONDS`` (10 s: a conservative guess for a model of a few GB from an SSD;
the 5–30 s the engines take is the range).  Bounded: at most ``MAX_ENTRIES`` (node, model)
pairs, the least recently observed forgotten first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from enum import Enum

__all__ = ["DEFAULT_LOAD_SECONDS", "LoadCosts", "LoadEvidence"]

DEFAULT_LOAD_SECONDS = 10.0
MIN_LOAD_SECONDS = 0.1  # a smaller Ollama load_duration: the model was already loaded
MAX_LOAD_SECONDS = 3600.0  # longer is not a load figure we believe
WEIGHT = 0.5
MAX_ENTRIES = 4096


class LoadEvidence(Enum):
    """Where a load time came from, most trusted first."""

    REPORTED = "reported"
    TRANSITION = "transition"
    FIRST_BYTE = "firstByte"


_ORDER = tuple(LoadEvidence)


class LoadCosts:
    """Load seconds per (node, model), learnt (the module docstring says the rule)."""

    def __init__(self, maxEntries: int = MAX_ENTRIES) -> None:
        self.maxEntries = maxEntries
        self._costs: OrderedDict[tuple[str, str], dict[LoadEvidence, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._costs)

    def observe(self, nodeId: str, model: str, seconds: float, evidence: LoadEvidence) -> bool:
        """A load of ``model`` on ``nodeId`` took ``seconds``; False when not believable."""
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_LOAD_SECONDS):
            return False
        key = (nodeId, model)
        entry = self._costs.get(key)
        if entry is None:
            if len(self._costs) >= self.maxEntries:
                self._costs.popitem(last=False)
            entry = self._costs[key] = {}
        else:
            self._costs.move_to_end(key)
        last = entry.get(evidence)
        entry[evidence] = seconds if last is None else last + WEIGHT * (seconds - last)
        return True

    def loadDuration(self, nodeId: str, model: str, nanoseconds: int) -> bool:
        """Ollama's ``load_duration`` of an answer (ns): a load when at least
        ``MIN_LOAD_SECONDS``; returns whether it was one."""
        if type(nanoseconds) is not int or nanoseconds < MIN_LOAD_SECONDS * 1e9:
            return False
        return self.observe(nodeId, model, nanoseconds / 1e9, LoadEvidence.REPORTED)

    def known(self, nodeId: str, model: str) -> float | None:
        """The best evidence for (node, model), or None."""
        entry = self._costs.get((nodeId, model))
        if entry is None:
            return None
        for evidence in _ORDER:
            if evidence in entry:
                return entry[evidence]
        return None

    def estimate(self, nodeId: str, model: str) -> float:
        """Expected seconds to load ``model`` on ``nodeId`` (the fallbacks above)."""
        known = self.known(nodeId, model)
        if known is not None:
            return known
        elsewhere = [self.known(n, m) for n, m in self._costs if m == model]
        onNode = [self.known(n, m) for n, m in self._costs if n == nodeId]
        for values in (elsewhere, onNode):
            numbers = [v for v in values if v is not None]
            if numbers:
                return sum(numbers) / len(numbers)
        return DEFAULT_LOAD_SECONDS

    def forget(self, nodeId: str) -> None:
        """``nodeId`` left the fleet."""
        for key in [k for k in self._costs if k[0] == nodeId]:
            del self._costs[key]

    def snapshot(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per node, per model, each kind of evidence (seconds, rounded)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (nodeId, model), entry in self._costs.items():
            out.setdefault(nodeId, {})[model] = {e.value: round(v, 3) for e, v in entry.items()}
        return out
