"""Chat conversations for placement tests: the message list of a conversation's n-th turn."""

from __future__ import annotations

# Enough text that a home counts: the prompt is worth ``choose.MIN_MATCH_SECONDS`` of
# recomputing at the default prefill rate.
DETAIL = "with the details that make it worth caching " * 12


def turn(n: int, topic: str = "weather", detail: str = DETAIL) -> list[dict[str, str]]:
    """The message list of the n-th turn (1-based) of a conversation about ``topic``, each
    question carrying ``detail``."""
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(n):
        messages.append({"role": "user", "content": f"{topic} question {i} {detail}"})
        if i + 1 < n:
            messages.append({"role": "assistant", "content": f"{topic} answer {i}"})
    return messages
