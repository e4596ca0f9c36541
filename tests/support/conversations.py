"""Chat conversations for placement tests: the message list of a conversation's n-th turn,
and a chat request's placement key."""

from __future__ import annotations

from typing import Any

from nvpair.proxy.placement.keys import AffinityKey, keyFor

CHAT = b"/v1/chat/completions"

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


def chatKey(messages: list[Any], model: str = "m1") -> AffinityKey:
    """The placement key of a llama.cpp chat request for ``model`` with ``messages``."""
    key = keyFor("llamacpp", model, CHAT, {"model": model, "messages": messages})
    assert key is not None
    return key
