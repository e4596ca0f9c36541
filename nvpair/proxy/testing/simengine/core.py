"""What every part of one simulated engine shares: settings, slots, cache, counters, state.

The routes, the control routes and the runs read and change the engine through this one
object; ``SimEngine`` owns it and adds the listening socket and the connections.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs
from twisted.internet.interfaces import IReactorTime
from zope.interface import Interface

from nvpair.proxy.testing.fakeengine.answers import JSON, Responder
from nvpair.proxy.testing.fakeengine.connection import EngineConnection
from nvpair.proxy.testing.simengine.agents.stored import StoredResponses
from nvpair.proxy.testing.simengine.cache import PrefixCache
from nvpair.proxy.testing.simengine.config import Failure, SimConfig
from nvpair.proxy.testing.simengine.residency.model import Residency
from nvpair.proxy.testing.simengine.slots import Slots
from nvpair.proxy.testing.simengine.tokens import MAX_WORDS


@attrs.define
class Stats:
    """What the engine has done since it started (or since ``/sim/reset``)."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    refused: int = 0
    failed: int = 0
    promptTokens: int = 0
    cachedTokens: int = 0
    completionTokens: int = 0
    promptSeconds: float = 0.0
    predictedSeconds: float = 0.0
    decodes: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        for field in attrs.fields(Stats):
            setattr(self, field.name, field.default)


class IRun(Interface):
    """What the engine needs of a request it tracks: a way to cancel it."""

    def cancel() -> None:
        """The client went away: give up the slot or the place in the FIFO."""


_PER_MODEL = ("ollama", "lmstudio")  # dialects whose loaded models each have their own slots


class Core:
    """The shared state of one simulated engine, timed on ``clock``."""

    def __init__(self, clock: IReactorTime, config: SimConfig) -> None:
        self.clock = clock
        self.config = config
        self.failure: Failure | None = config.failure
        self.stats = Stats()
        self.cache = PrefixCache(config.cacheTokens // config.blockSize)
        self.slots = Slots(clock, config.slots, config.queueMax)
        self.responder = Responder(config.name)
        self.residency = Residency(clock, config)
        # Ollama, LM Studio, router mode: each model's own slots (per installed model at most)
        self.modelSlots: dict[str, Slots] = {}
        self.runs: dict[EngineConnection, IRun] = {}
        self.stored = StoredResponses()
        """The responses this engine produced (a stateful dialect's, LM Studio's)."""

    def loadedModels(self) -> list[tuple[str, float | None]]:
        """The models loaded now, each with when it unloads if left idle (None: never)."""
        return self.residency.loadedModels()

    def slotsFor(self, model: str) -> Slots:
        """The slots a request for ``model`` runs in: the engine's, or that model's own where
        each loaded model serves ``--slots`` at once by itself (Ollama, whose
        ``OLLAMA_NUM_PARALLEL`` is per model; LM Studio, whose "Max Concurrent Predictions"
        is set per loaded model; router mode, a child server per model)."""
        if not (self.config.router or self.config.dialect in _PER_MODEL):
            return self.slots
        slots = self.modelSlots.get(model)
        if slots is None:
            slots = self.modelSlots[model] = Slots(
                self.clock, self.config.slots, self.config.queueMax
            )
        return slots

    def resolve(self, model: str) -> str | None:
        """The configured model a request names (Ollama's implicit ``:latest``; llama-server
        serves its one model whatever the name, unless it is a router), or None when
        unknown."""
        models = self.config.models
        if self.config.dialect == "llamacpp" and not self.config.router:
            return models[0]
        if model in models:
            return model
        if self.config.dialect == "ollama" and model + ":latest" in models:
            return model + ":latest"
        return None

    def taskAt(self, slotId: int) -> int:
        """The task id in slot ``slotId``; -1 when idle."""
        if not self.slots.isBusy(slotId):
            return -1
        job = self.slots.jobAt(slotId)
        return job.task if job is not None else 0

    def track(self, connection: EngineConnection, run: IRun) -> None:
        """Remember the run on ``connection`` until it is done (or the client leaves)."""
        self.runs[connection] = run

    def untrack(self, run: IRun) -> None:
        """``run`` finished."""
        for connection, known in list(self.runs.items()):
            if known is run:
                del self.runs[connection]

    def document(self, connection: EngineConnection, status: int, body: bytes) -> None:
        """Answer with one JSON document."""
        self.responder.sendDocument(connection, status, None, body, JSON)

    def turnedAway(
        self,
        connection: EngineConnection,
        words: int,
        refuse: Callable[[int, str, str], None],
        error: Callable[[int, str, str], bytes],
    ) -> bool:
        """What every inference route checks before serving a prompt of ``words`` words:
        over the context it is refused (400); a simulated failure (``/sim/fail``) answers
        its status, as ``error`` shapes it, after its delay.  True when answered so."""
        if words > MAX_WORDS or words >= self.config.nCtx:
            message = "the request exceeds the available context size"
            refuse(400, message, "exceed_context_size_error")
            return True
        failure = self.failure
        if failure is None:
            return False
        self.stats.failed += 1
        extra = None if failure.retryAfter is None else {"Retry-After": str(failure.retryAfter)}
        body = error(failure.status, "simulated failure", "unavailable_error")

        def fail() -> None:
            self.responder.sendDocument(connection, failure.status, extra, body, JSON)

        connection.later(failure.delayMs / 1000.0, fail)
        return True

    def statsDocument(self) -> bytes:
        """``GET /sim/stats``."""
        s, slots = self.stats, self.slots
        every = [slots, *self.modelSlots.values()]
        doc = {
            "name": self.config.name,
            "dialect": self.config.dialect,
            "requests": s.requests,
            "completed": s.completed,
            "cancelled": s.cancelled,
            "refused": s.refused,
            "failed": s.failed,
            "prompt_tokens": s.promptTokens,
            "cached_tokens": s.cachedTokens,
            "completion_tokens": s.completionTokens,
            "slots": {
                "total": slots.total,
                "busy": sum(each.busy for each in every),
                "held": slots.held,
            },
            "queue": {
                "depth": sum(each.queued for each in every),
                "max": slots.queueMax,
                "waits": sum(each.waits for each in every),
                "wait_ms_total": round(sum(each.waitTotal for each in every) * 1000.0, 3),
                "wait_ms_max": round(max(each.waitMax for each in every) * 1000.0, 3),
            },
            "cache": {
                "blocks": len(self.cache),
                "capacity_blocks": self.cache.capacityBlocks,
                "block_size": self.config.blockSize,
                "evictions": self.cache.evictions,
            },
            "failing": None
            if self.failure is None
            else {"status": self.failure.status, "delay_ms": self.failure.delayMs},
            "residency": self.residency.statsDocument(),
        }
        return json.dumps(doc, separators=(",", ":")).encode()
