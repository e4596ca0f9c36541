"""The seeded multi-tenant chat workload: tenants (apps) with long system prompts, users
holding multi-turn conversations, think time between turns.

Every tenant has its own system prompt of about ``systemWords`` words; each of its users
holds one conversation of ``turns`` turns (a question of about ``questionWords`` words, an
answer of ``answerTokens`` tokens), starting at a random moment within ``ramp`` seconds and
thinking an exponential time of mean ``think`` seconds between turns. The same seed gives
the same prompts and the same schedule.
"""

from __future__ import annotations

import random

import attrs


@attrs.frozen
class Sizes:
    """The workload's dimensions."""

    tenants: int = 12
    users: int = 4
    turns: int = 4
    systemWords: int = 1500
    questionWords: int = 40
    answerTokens: int = 32
    think: float = 3.0
    ramp: float = 8.0
    seed: int = 1

    def workingSet(self) -> int:
        """Tokens a cache would need to hold every tenant's prompt and every conversation."""
        perTurn = self.questionWords + self.answerTokens + 3
        return (
            self.tenants * (self.systemWords + 1) + self.tenants * self.users * self.turns * perTurn
        )


@attrs.frozen
class Conversation:
    """One user's conversation: its tenant, when it starts, its questions and pauses."""

    tenant: int
    user: int
    start: float
    system: str
    questions: tuple[str, ...]
    pauses: tuple[float, ...]


_VOCAB = [
    f"{a}{b}" for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en", "is")
]


def randomText(rng: random.Random, n: int, tag: str) -> str:
    """``n`` words drawn by ``rng``, every 50th prefixed by ``tag``."""
    words = [rng.choice(_VOCAB) for _ in range(n)]
    # a tag every 50 words makes each tenant's and user's text its own
    return " ".join(w if i % 50 else f"{tag}{w}" for i, w in enumerate(words))


def conversations(sizes: Sizes) -> list[Conversation]:
    """Every conversation of the workload, by start time."""
    rng = random.Random(sizes.seed)
    systems = [randomText(rng, sizes.systemWords, f"t{t}") for t in range(sizes.tenants)]
    out = []
    for tenant in range(sizes.tenants):
        for user in range(sizes.users):
            questions = tuple(
                randomText(rng, sizes.questionWords, f"u{tenant}.{user}.{k}")
                for k in range(sizes.turns)
            )
            pauses = tuple(
                rng.expovariate(1 / sizes.think) if sizes.think > 0 else 0.0 for _ in questions
            )
            out.append(
                Conversation(
                    tenant, user, rng.uniform(0, sizes.ramp), systems[tenant], questions, pauses
                )
            )
    out.sort(key=lambda c: c.start)
    return out
