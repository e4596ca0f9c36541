"""The simulated engine's settings (one frozen value; the CLI builds it from flags)."""

from __future__ import annotations

from typing import Any

import attrs

DIALECTS = ("llamacpp", "lmstudio", "ollama")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, not {value}")


def _notNegative(instance: object, attribute: attrs.Attribute[Any], value: int | float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} cannot be negative, not {value}")


@attrs.frozen
class Failure:
    """Answer every inference request with ``status`` after ``delayMs`` (``Retry-After`` when
    ``retryAfter`` is set)."""

    status: int = 503
    delayMs: float = 0.0
    retryAfter: int | None = None


@attrs.frozen
class SimConfig:
    """How a simulated engine behaves: dialect, models, slots, cache and costs.

    ``prefillMs`` is charged per prompt token not served from the cache, ``decodeMs`` per
    generated token; ``cacheTokens`` is the prefix cache's capacity in tokens (whole blocks
    of ``blockSize``); ``queueMax`` bounds the FIFO behind the ``slots``; ``outputTokens`` is
    the answer length when the request sets no ``max_tokens`` (nor ``n_predict``, nor
    Ollama's ``options.num_predict``), and ``maxOutputTokens`` caps any request's.

    Models: ``loaded`` are loaded at start (None: all of them); a request for another one
    first waits ``loadMs`` (or its own in ``loadMsPerModel``) while it loads, one load at a
    time; past ``maxLoaded`` models (0: no limit) the least recently used idle one unloads,
    and so does one unused for ``keepAlive`` seconds (Ollama's 5 minutes).  ``router`` makes
    a ``llamacpp`` engine a llama-server in router mode (``autoload``: requests load their
    model, as without ``--no-models-autoload``); ``lmstudioV1`` serves LM Studio's v1 REST
    API beside ``/api/v0`` (``simengine/residency``).
    """

    dialect: str = attrs.field(default="llamacpp", validator=attrs.validators.in_(DIALECTS))
    models: tuple[str, ...] = ("m",)
    name: str = "sim"
    slots: int = attrs.field(default=4, validator=_positive)
    queueMax: int = attrs.field(default=64, validator=_notNegative)
    blockSize: int = attrs.field(default=16, validator=_positive)
    cacheTokens: int = attrs.field(default=65536, validator=_notNegative)
    prefillMs: float = attrs.field(default=0.5, validator=_notNegative)
    decodeMs: float = attrs.field(default=10.0, validator=_notNegative)
    outputTokens: int = attrs.field(default=16, validator=_positive)
    maxOutputTokens: int = attrs.field(default=4096, validator=_positive)
    nCtx: int = attrs.field(default=8192, validator=_positive)
    slotsEndpoint: bool = True
    metricsEndpoint: bool = True
    failure: Failure | None = None
    loaded: tuple[str, ...] | None = None
    loadMs: float = attrs.field(default=0.0, validator=_notNegative)
    maxLoaded: int = attrs.field(default=0, validator=_notNegative)
    keepAlive: float = attrs.field(default=300.0, validator=_notNegative)
    loadMsPerModel: tuple[tuple[str, float], ...] = ()
    router: bool = False
    autoload: bool = True
    lmstudioV1: bool = True
