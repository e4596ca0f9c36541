"""The seams through which standalone placement, the queue and holds read what is known of
each node: its engine's own state (``IEngineStates``), its room (``IRoomLedger``) and which
models it holds (``IResidency``).  A leaf, so that the stores, placement and the queue share
them without importing one another."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import attrs
from twisted.internet.defer import Deferred
from zope.interface import Interface


class IEngineStates(Interface):
    """What standalone placement reads of the engines' own state (spec §10) besides room:
    the latest *fresh* probe of each node's engine (loaded models) and what its answers
    reported (prefill time).  A node never probed, whose last probe failed, timed out, was
    malformed or is older than two intervals is unknown (``None``), never idle."""

    def modelLoaded(nodeId: str, model: str) -> bool | None:
        """Whether the engine of ``nodeId`` has ``model`` loaded now (Ollama ``/api/ps``,
        LM Studio's models list), or None when it does not say or is unknown."""

    def prefillMs(nodeId: str) -> float | None:
        """The engine of ``nodeId``'s prefill time per evaluated prompt token (ms), or None
        before it reported one."""

    def promptsMove(nodeId: str) -> bool:
        """Whether the engine of ``nodeId`` is known to move a saved prompt to the request
        that matches it best instead of copying it (llama.cpp's own server)."""


class IRoomLedger(Interface):
    """One record per node of the room its engine has for one more of our requests
    (``nodestate.ledger.RoomLedger``, spec §11 "Room"): one rule for *free now* and one for
    *known full*, read alike by placement, the fair queue and holds."""

    def free(nodeId: str) -> int | None:
        """Free slots on ``nodeId`` now (at most 0 when full), or None when unknown."""

    def knownFull(nodeId: str) -> bool:
        """Whether ``nodeId`` is known to have no room now."""

    def capacity(nodeId: str) -> int | None:
        """The most of ours ``nodeId`` can run at once as known now, or None."""

    def serviceTime(nodeId: str) -> float | None:
        """Seconds our requests on ``nodeId`` hold their slot, if seen."""

    def reportsSlots(nodeId: str) -> bool:
        """Whether a fresh report of ``nodeId``'s slots is in force."""

    def slotTaken(nodeId: str) -> None:
        """One of ours waits in ``nodeId``'s own queue: a slot the report left free there
        is taken by a client the proxy does not see."""

    def status(nodeId: str) -> dict[str, object]:
        """What ``/status`` shows of ``nodeId``'s room (``slotsAvailable``, ``slotsLimit``,
        ``slotsForeign``, ``learntLimit``, ``serviceSeconds`` where known)."""

    def subscribe(listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(nodeId)`` whenever room may have appeared on ``nodeId``; returns a
        function that unsubscribes it."""


class ModelState(Enum):
    """Whether a node holds a model, as its engine last said (and the proxy's own loads)."""

    LOADED = "loaded"
    """In memory and ready."""
    LOADING = "loading"
    """Being loaded (the engine says so, or the proxy started the load and it is not done)."""
    SLEEPING = "sleeping"
    """llama.cpp router mode: its child sleeps, weights out of memory: a request reloads it
    (cost as cold) while it keeps its place among the resident models."""
    COLD = "cold"
    """Not resident: a request would load it first."""
    UNKNOWN = "unknown"
    """The engine's state is not known now (no fresh probe), or it says nothing of models."""


@attrs.frozen
class Eviction:
    """What a load on a node would likely push out: the least recently used resident model
    with no request of ours running (``idle``; when every resident model is busy, the least
    recently used one, ``idle`` False: the load waits), its recent demand there and over the
    fleet (requests per minute, decayed over about a minute) and on how many nodes it is
    resident (this one included)."""

    model: str
    idle: bool
    demand: float
    fleetDemand: float
    copies: int


class IResidency(Interface):
    """What standalone placement reads of the models each node holds (spec §11, "Model
    residency"): fed by the engines' probes, the inventories and the proxy's own requests
    and loads.  Node ids are backend URLs; models are normalized names."""

    def state(nodeId: str, model: str) -> ModelState:
        """Whether ``nodeId`` holds ``model`` now."""

    def loadSeconds(nodeId: str, model: str) -> float:
        """Expected seconds to load ``model`` on ``nodeId`` (learnt, else a default)."""

    def likelyEviction(nodeId: str, model: str) -> Eviction | None:
        """What loading ``model`` on ``nodeId`` would evict; None when it is resident or
        there is room (or nothing is known of what the node can hold)."""

    def held(nodeId: str) -> int:
        """How many models ``nodeId`` holds or is loading now, as known (0: none known)."""

    def mostHeld(nodeId: str) -> int:
        """The most models ``nodeId`` was seen holding at once (0: never seen)."""

    def room(nodeId: str) -> int | None:
        """How many more models ``nodeId`` can hold without evicting (None: unknown)."""

    def demand(model: str, nodeId: str | None = None) -> float:
        """Requests per minute for ``model`` (on ``nodeId``, or over the fleet), decayed."""

    def holders(model: str) -> tuple[str, ...]:
        """The nodes where ``model`` is loaded or loading."""

    def roomElsewhere(nodeId: str) -> bool:
        """Whether a node other than ``nodeId`` (its state fresh) has room for one more
        model: fewer than it can hold, or, never seen evicting, fewer than another node was
        seen holding (loads expected counted)."""

    def neediest() -> float:
        """The most fleet demand per copy, one more copy counted, among the models held
        anywhere, loading ones too (0 when none): what a further copy in free room must
        come near."""

    def residentDemand(nodeId: str) -> float:
        """The most fleet demand per copy (requests per minute over its holders) among the
        models ``nodeId`` holds, loading ones included (0 when none)."""

    def requested(model: str) -> None:
        """A request for ``model`` arrived: it counts in the fleet's demand for it (once
        per request, whether it waits for a load, in the queue or for nothing)."""

    def running(nodeId: str, model: str) -> int:
        """Requests of ours running for ``model`` on ``nodeId``."""

    def modelFull(nodeId: str, model: str) -> bool:
        """Whether ``model``'s own parallel slots on ``nodeId`` are all taken by ours, on an
        engine whose slots are per model and not reported (Ollama's
        ``OLLAMA_NUM_PARALLEL``, LM Studio's instance ``parallel``): its instance's figure,
        else the learnt one; False while neither is known."""

    def parallel(nodeId: str, model: str) -> int | None:
        """How many requests for ``model`` ``nodeId`` runs at once, for an engine that
        reports no slots: the fleet file's ``max_concurrency``, else the engine's own figure
        (LM Studio's instance ``parallel``), else learnt from its waits (Ollama); None when
        none is known."""

    def loadStarted(nodeId: str, model: str) -> None:
        """The proxy is starting a load of ``model`` on ``nodeId``: it is loading there
        from now on, until the engine or a first byte says it is done."""

    def loadAbandoned(nodeId: str, model: str) -> None:
        """The request that was to load ``model`` on ``nodeId`` failed there: no load of
        ours is expected any more (the engine's next probe says what it holds)."""

    def nodeStatus(nodeId: str) -> dict[str, object]:
        """``/status``: what ``nodeId`` holds, its loads and evictions seen (empty: none)."""

    def snapshot() -> dict[str, object]:
        """``/status`` ``residency``: the default load time and every node's status."""


class IModelActions(Interface):
    """Unloading a model through its engine's own API (protocol §9), for placement: only
    where the fleet file says ``unload_idle = true``, only an idle model."""

    def allowsUnload(nodeId: str) -> bool:
        """Whether the fleet file lets the proxy unload models on ``nodeId``."""

    def unload(nodeId: str, model: str) -> Deferred[bool]:
        """Unload ``model`` on ``nodeId`` when allowed and none of our requests run on it;
        fires with whether the engine did (False: not allowed, busy, or it failed)."""
