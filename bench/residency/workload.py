"""The seeded workload: clients asking for models by Zipf popularity, in closed loops.

``clients`` loops run for ``duration`` seconds; each picks its next model with probability
proportional to ``1 / rank ** zipf`` over ``models`` models, sends a short streamed chat and
thinks an exponential time of mean ``think`` seconds after the answer.  The same seed gives
the same choices and pauses (how many of them are used depends on the answers' speed).
"""

from __future__ import annotations

import random

import attrs


@attrs.frozen
class Workload:
    """The workload's dimensions."""

    models: int = 5
    clients: int = 8
    duration: float = 75.0
    think: float = 0.5
    zipf: float = 1.0
    answerTokens: int = 16
    seed: int = 1

    def names(self) -> list[str]:
        """The models, most popular first (Ollama's names: ``m0:latest``, ...)."""
        return [f"m{i}:latest" for i in range(self.models)]

    def popularity(self) -> list[float]:
        """Each model's share of the requests."""
        weights = [1.0 / (rank + 1) ** self.zipf for rank in range(self.models)]
        total = sum(weights)
        return [w / total for w in weights]


MAX_STEPS = 100_000  # per client: far more than any duration uses


class Script:
    """One client's seeded sequence of (model, pause after the answer)."""

    def __init__(self, workload: Workload, client: int) -> None:
        self.rng = random.Random(workload.seed * 1000 + client)
        self.names = workload.names()
        self.weights = workload.popularity()
        self.think = workload.think
        self.steps = 0

    def next(self) -> tuple[str, float] | None:
        """The next model and pause, or None past ``MAX_STEPS``."""
        if self.steps >= MAX_STEPS:
            return None
        self.steps += 1
        model = self.rng.choices(self.names, self.weights)[0]
        return model, self.rng.expovariate(1.0 / self.think) if self.think > 0 else 0.0
