"""What routing, fairness and placement need of a request body, read once at admission.

A body is read at admission (``admission.admit``) into ``RequestFacts``: the fields the
proxy acts on, bounded, and nothing else.  The parsed document itself is not kept for the
request's life: whatever placement needs of the prompt is turned into digests
(``placement.keys``) before the document is dropped.

Every string here is one a client controls: each is kept only when it is at most
``MAX_FIELD`` characters (a longer one is treated as absent), and none is ever logged,
traced or shown; fairness and placement keep digests of them only.
"""

from __future__ import annotations

import attrs

__all__ = ["MAX_FIELD", "Identity", "RequestFacts"]

MAX_FIELD = 256


@attrs.frozen
class Identity:
    """Who a request says its user is, from its body (protocol §9's client rule reads these
    after ``Authorization``): Anthropic ``metadata.user_id``, OpenAI ``safety_identifier``,
    OpenAI ``user``; each a non-empty string of at most ``MAX_FIELD`` characters, or None."""

    anthropicUser: str | None = None
    safetyIdentifier: str | None = None
    user: str | None = None


NO_IDENTITY = Identity()


@attrs.frozen
class RequestFacts:
    """The fields of an inference body the proxy acts on (None: absent, or not usable)."""

    identity: Identity = NO_IDENTITY
    previousResponseId: str | None = None
    """OpenAI Responses ``previous_response_id``: the stored response a follow-up extends."""
    promptCacheKey: str | None = None
    """OpenAI ``prompt_cache_key``: an explicit grouping hint for placement."""
    cachePrompt: bool | None = None
    """llama.cpp ``cache_prompt`` (False: the client asked the engine not to reuse its cache)."""
    stream: bool | None = None
    """``stream`` as the body says it (None: not said; each route has its own default)."""


NO_FACTS = RequestFacts()
