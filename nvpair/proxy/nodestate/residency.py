"""Which models each node holds, what a load there costs and would evict (spec §11, "Model
residency"): ``IResidency``, standalone mode only.

**Fed by** each fresh probe that lists models (the poller's reports), the inventory polls,
and the proxy's own work: its requests, the loads it starts, finishes or abandons, the
unloads it asks, the engines' load figures and first bytes.

* **State** per (node, model): ``loaded``, ``loading``, ``sleeping`` as the engine says;
  ``cold`` when its last listing does not have the model; ``unknown`` when the engine says
  nothing of models, or no probe is fresh and none listed models within
  ``LISTING_TRUSTED`` s.  A load the proxy started is ``loading`` at once, until the engine
  says it is loaded (router mode, LM Studio), its first byte or load figure comes, or its
  expected load time has passed since (Ollama lists a loading model as resident: then
  ``EXPECT_FACTOR`` × that time at most when it is not listed).  A load seen done (a first
  byte, a load figure, a load call answered) is ``loaded`` until a probe lists it,
  ``DONE_GRACE`` s at most (a probe sent before it may not list it).  The idle model a
  load of ours will likely evict is ``cold`` from the load's start, until a probe shows it
  gone or still there ``EVICTION_SETTLE`` s after (the engine had room): requests for it
  do not reach it meanwhile, to find it evicted and load it back.
* **Loads and evictions seen**: a model newly listed is a load; one gone is *unloaded*
  (we asked within ``ASKED_WINDOW`` s), *expired* (its ``expires_at`` passed) or *evicted*.
* **What a node can hold**: the most models it was seen holding at once, and (where the
  engine reports sizes) the most bytes; a load fits when either says so.  Before a node was
  seen holding anything, unknown; before it was seen evicting a model, a lower bound only
  (``room`` says it, but no load is predicted to evict).
* **What a load would evict**: the least recently used resident model (by the proxy's own
  use, else the engine's ``expires_at`` order, else when it appeared) with no request of
  ours running; when all are busy, the least recently used one (the load waits).
* **Demand**: requests per minute per (node, model) and per model (``Demand``).

Bounded: ``MAX_NODES`` nodes, ``MAX_MODELS`` models per node in each table,
``MAX_DEMAND_MODELS`` fleet-wide demand entries, ``MAX_EVENTS`` events per node.
"""

from __future__ import annotations

import math

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nvpair.proxy.nodestate.concurrency import ConcurrencyEstimator
from nvpair.proxy.nodestate.demand import Demand
from nvpair.proxy.nodestate.holdings import MAX_MODELS, NodeHoldings, residentBytes
from nvpair.proxy.nodestate.interfaces import Eviction, IModelActions, IResidency, ModelState
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.loadcost import DEFAULT_LOAD_SECONDS, LoadCosts, LoadEvidence
from nvpair.proxy.nodestate.probes import LOADED, LOADING, EngineReport
from nvpair.proxy.nodestate.states import EngineStates

__all__ = ["Residency"]

MAX_NODES = 256
MAX_DEMAND_MODELS = 1024
EXPECT_FACTOR = 3.0
SHOWN_EVENTS = 8
DONE_GRACE = 5.0
LISTING_TRUSTED = 10.0


@implementer(IResidency)
class Residency:
    """The residency view of every standalone node (the module docstring says the rules)."""

    def __init__(
        self,
        clock: IReactorTime,
        states: EngineStates,
        ledger: RoomLedger,
        maxNodes: int = MAX_NODES,
    ) -> None:
        self.clock = clock
        self.states = states
        self.ledger = ledger  # the fleet file's ``max_concurrency`` per node
        self.maxNodes = maxNodes
        self.costs = LoadCosts()
        self.concurrency = ConcurrencyEstimator(clock)
        self._nodes: dict[str, NodeHoldings] = {}
        self._demand = Demand(MAX_DEMAND_MODELS)
        self._sizes: dict[str, int] = {}  # model -> bytes, as last reported anywhere
        # Unloading through the engines' own APIs where the fleet file allows it (standalone
        # mode's ``model-actions`` service sets it).
        self.actions: IModelActions | None = None

    def _node(self, nodeId: str) -> NodeHoldings | None:
        node = self._nodes.get(nodeId)
        if node is None and len(self._nodes) < self.maxNodes:
            node = self._nodes[nodeId] = NodeHoldings()
        return node

    # -- fed by the probes and the inventories --

    def observe(self, nodeId: str, report: EngineReport | None) -> None:
        """A fresh probe of ``nodeId``: diff its resident models with the previous one."""
        if report is None or report.resident is None:
            return  # this engine says nothing of models
        node = self._node(nodeId)
        if node is None:
            return
        now = self.clock.seconds()
        if report.installed is not None:
            node.installed = len(report.installed)
        new = {r.name: r for r in report.resident[:MAX_MODELS]}
        for name, model in new.items():
            node.done.pop(name, None)
            old = node.resident.get(name)
            if old is None:
                node.since[name] = now
                if node.seen:
                    node.event(now, "loads", name, "load")
            if model.state == LOADING:
                node.loadingSince.setdefault(name, node.expected.get(name, now))
            elif name in node.loadingSince:
                started = node.loadingSince.pop(name)
                if model.state == LOADED and old is not None and old.state == LOADING:
                    self.costs.observe(nodeId, name, now - started, LoadEvidence.TRANSITION)
                    node.expected.pop(name, None)
            if report.router and model.state == LOADED:
                node.expected.pop(name, None)  # a router says when a load is done
            size = residentBytes(model)
            if size is not None and len(self._sizes) < MAX_DEMAND_MODELS:
                self._sizes[name] = size
        for name, old in node.resident.items():
            if name not in new:
                node.since.pop(name, None)
                node.loadingSince.pop(name, None)
                node.gone(now, name, old)
        node.settle(new, now)
        node.resident = new
        node.seen = True
        node.listedAt = now
        node.capacity = max(node.capacity, len(new))
        sizes = [residentBytes(m) for m in new.values()]
        if sizes and all(s is not None for s in sizes):
            node.memory = max(node.memory, sum(s for s in sizes if s is not None))

    def setInventory(self, nodeId: str, models: int | None) -> None:
        """How many models ``nodeId`` has installed (its inventory poll; None: unknown)."""
        node = self._node(nodeId)
        if node is not None and models is not None:
            node.installed = models

    def forget(self, nodeId: str) -> None:
        """``nodeId`` left the fleet."""
        self._nodes.pop(nodeId, None)
        self.costs.forget(nodeId)
        self.concurrency.forget(nodeId)

    # -- fed by the proxy's own work --

    def began(self, nodeId: str, model: str) -> None:
        """A request of ours for ``model`` started on ``nodeId``."""
        node = self._node(nodeId)
        if node is None:
            return
        now = self.clock.seconds()
        if model in node.running or len(node.running) < MAX_MODELS:
            node.running[model] = node.running.get(model, 0) + 1
        self._use(node, model, now)
        node.demand.bump(model, now)
        self._demand.bump(model, now)

    def ended(self, nodeId: str, model: str) -> None:
        """A request of ours for ``model`` on ``nodeId`` ended."""
        node = self._nodes.get(nodeId)
        if node is None:
            return
        left = node.running.get(model, 0) - 1
        if left > 0:
            node.running[model] = left
        else:
            node.running.pop(model, None)
        self._use(node, model, self.clock.seconds())

    def _use(self, node: NodeHoldings, model: str, now: float) -> None:
        if model in node.used or len(node.used) < MAX_MODELS:
            node.used[model] = now

    def loadStarted(self, nodeId: str, model: str) -> None:
        """The proxy started a load of ``model`` on ``nodeId`` (it is ``loading`` now); the
        idle model it will likely evict there is taken as gone until a probe says, and
        unloaded through the engine's API first where the fleet file says ``unload_idle``."""
        eviction = self.likelyEviction(nodeId, model)
        node = self._node(nodeId)
        if node is not None and (model in node.expected or len(node.expected) < MAX_MODELS):
            node.expected[model] = self.clock.seconds()
        if node is not None and eviction is not None and eviction.idle:
            node.evicting[eviction.model] = self.clock.seconds()
            actions = self.actions  # ``unload_idle``: make the room through its API first
            if actions is not None and actions.allowsUnload(nodeId):
                actions.unload(nodeId, eviction.model)

    def loadAbandoned(self, nodeId: str, model: str) -> None:
        """The request that was to load ``model`` on ``nodeId`` failed there: no load of
        ours is expected any more (the engine's next probe says what it holds)."""
        node = self._nodes.get(nodeId)
        if node is not None:
            node.expected.pop(model, None)

    def loadDone(self, nodeId: str, model: str, seconds: float | None = None) -> None:
        """A load of ``model`` on ``nodeId`` is done (the engine's load call answered),
        having taken ``seconds`` (as the engine said or as measured; None: not known)."""
        node = self._nodes.get(nodeId)
        if node is not None:
            node.expected.pop(model, None)
            if model not in node.resident and (model in node.done or len(node.done) < MAX_MODELS):
                node.done[model] = self.clock.seconds()
        if seconds is not None:
            self.costs.observe(nodeId, model, seconds, LoadEvidence.REPORTED)

    def loadDuration(self, nodeId: str, model: str, nanoseconds: int) -> None:
        """Ollama's ``load_duration`` on an answer of ``nodeId`` for ``model`` (ns)."""
        if self.costs.loadDuration(nodeId, model, nanoseconds):
            self.loadDone(nodeId, model)

    def coldFirstByte(self, nodeId: str, model: str, seconds: float) -> None:
        """A request that found ``model`` cold on ``nodeId`` had its first byte after
        ``seconds``: the load is done, and cost about that."""
        self.costs.observe(nodeId, model, seconds, LoadEvidence.FIRST_BYTE)
        self.loadDone(nodeId, model)

    def firstByte(self, nodeId: str, running: int, seconds: float, work: float = 0.0) -> None:
        """A warm request started with ``running`` of ours on ``nodeId`` had its first byte
        after ``seconds`` (``work`` of it the engine's own): ``ConcurrencyEstimator``."""
        self.concurrency.observe(nodeId, running, seconds, work)

    def unloadAsked(self, nodeId: str, model: str) -> None:
        """The proxy asked ``nodeId`` to unload ``model`` (its disappearance is no eviction)."""
        node = self._node(nodeId)
        if node is not None and (model in node.asked or len(node.asked) < MAX_MODELS):
            node.asked[model] = self.clock.seconds()

    def running(self, nodeId: str, model: str) -> int:
        """Requests of ours running for ``model`` on ``nodeId``."""
        node = self._nodes.get(nodeId)
        return 0 if node is None else node.running.get(model, 0)

    def instance(self, nodeId: str, model: str) -> str | None:
        """The engine's instance id of ``model`` on ``nodeId`` (LM Studio), if it said."""
        node = self._nodes.get(nodeId)
        resident = None if node is None else node.resident.get(model)
        return None if resident is None else resident.instance

    # -- IResidency --

    def _expecting(self, nodeId: str, node: NodeHoldings, model: str, now: float) -> bool:
        started = node.expected.get(model)
        if started is None:
            return False
        factor = 1.0 if model in node.resident else EXPECT_FACTOR
        if now - started <= factor * self.costs.estimate(nodeId, model):
            return True
        del node.expected[model]
        return False

    def state(self, nodeId: str, model: str) -> ModelState:
        node = self._nodes.get(nodeId)
        if node is None or not (node.seen or model in node.expected or model in node.done):
            return ModelState.UNKNOWN  # nothing listed, no load of ours: as the rules below say
        now = self.clock.seconds()
        if self._expecting(nodeId, node, model, now):
            return ModelState.LOADING
        if self._done(node, model, now):
            return ModelState.LOADED
        if not node.seen or (
            now - node.listedAt > LISTING_TRUSTED and not self.states.fresh(nodeId)
        ):
            return ModelState.UNKNOWN
        resident = node.resident.get(model)
        if resident is None or model in node.evicting:
            return ModelState.COLD
        return ModelState(resident.state)

    def loadSeconds(self, nodeId: str, model: str) -> float:
        return self.costs.estimate(nodeId, model)

    def _done(self, node: NodeHoldings, model: str, now: float) -> bool:
        done = node.done.get(model)
        if done is None:
            return False
        if now - done <= DONE_GRACE:
            return True
        del node.done[model]
        return False

    def _count(self, nodeId: str, node: NodeHoldings) -> int:
        now = self.clock.seconds()
        pending = [m for m in list(node.expected) if self._expecting(nodeId, node, m, now)]
        pending += [m for m in list(node.done) if self._done(node, m, now)]
        return len(node.resident) + len({m for m in pending if m not in node.resident})

    def held(self, nodeId: str) -> int:
        node = self._nodes.get(nodeId)
        return 0 if node is None else self._count(nodeId, node)

    def mostHeld(self, nodeId: str) -> int:
        node = self._nodes.get(nodeId)
        return 0 if node is None else node.capacity

    def room(self, nodeId: str) -> int | None:
        node = self._nodes.get(nodeId)
        if node is None or node.capacity == 0 or self.states.fresh(nodeId) is None:
            return None
        return max(0, node.capacity - self._count(nodeId, node))

    def _fits(self, nodeId: str, node: NodeHoldings, model: str) -> bool:
        if self._count(nodeId, node) < node.capacity:
            return True
        size = self._sizes.get(model)
        held = [residentBytes(m) for m in node.resident.values()]
        if size is None or not node.memory or any(b is None for b in held):
            return False
        return sum(b for b in held if b is not None) + size <= node.memory

    def likelyEviction(self, nodeId: str, model: str) -> Eviction | None:
        state = self.state(nodeId, model)
        node = self._nodes.get(nodeId)
        if node is None or state in (ModelState.LOADED, ModelState.LOADING, ModelState.SLEEPING):
            return None
        if state is ModelState.UNKNOWN or not node.full or self._fits(nodeId, node, model):
            return None
        order = sorted(
            (m for m in node.resident if m != model),
            key=lambda m: (node.used.get(m, -math.inf), node.resident[m].until or "",
                           node.since.get(m, 0.0)),
        )  # fmt: skip
        if not order:
            return None
        idle = [m for m in order if not node.running.get(m)]
        victim = (idle or order)[0]
        return Eviction(
            victim, bool(idle), self.demand(victim, nodeId), self.demand(victim),
            len(self.holders(victim)),
        )  # fmt: skip

    def demand(self, model: str, nodeId: str | None = None) -> float:
        now = self.clock.seconds()
        if nodeId is None:
            return self._demand.perMinute(model, now)
        node = self._nodes.get(nodeId)
        return 0.0 if node is None else node.demand.perMinute(model, now)

    def holders(self, model: str) -> tuple[str, ...]:
        held = (ModelState.LOADED, ModelState.LOADING)
        return tuple(n for n in self._nodes if self.state(n, model) in held)

    def parallel(self, nodeId: str, model: str) -> int | None:
        limit = self.ledger.configured(nodeId)
        if limit is not None:
            return limit
        node = self._nodes.get(nodeId)
        resident = None if node is None else node.resident.get(model)
        if resident is not None and resident.parallel is not None:
            return resident.parallel
        return self.concurrency.learnt(nodeId)

    # -- /status --

    def snapshot(self) -> dict[str, object]:
        """``/status`` ``residency``: per node what it holds, loads and evictions seen."""
        return {
            "defaultLoadSeconds": DEFAULT_LOAD_SECONDS,
            "nodes": {nodeId: self.nodeStatus(nodeId) for nodeId in sorted(self._nodes)},
        }

    def nodeStatus(self, nodeId: str) -> dict[str, object]:
        """One node's residency for ``/status`` (each facade node's ``residency``)."""
        node = self._nodes.get(nodeId)
        if node is None:
            return {}
        now = self.clock.seconds()
        names = sorted(set(node.resident) | {m for m in node.expected if m not in node.resident})
        models = []
        for name in names[:MAX_MODELS]:
            resident = node.resident.get(name)
            models.append(
                {
                    "model": name,
                    "state": self.state(nodeId, name).value,
                    "sinceSeconds": round(now - node.since.get(name, now), 1),
                    "running": node.running.get(name, 0),
                    "demandPerMinute": round(self.demand(name, nodeId), 2),
                    "loadSeconds": round(self.costs.estimate(nodeId, name), 2),
                    "sizeBytes": None if resident is None else residentBytes(resident),
                }
            )
        return {
            "fresh": self.states.fresh(nodeId) is not None and node.seen,
            "capacity": node.capacity or None,
            "memoryBytes": node.memory or None,
            "installed": node.installed,
            "parallel": self.concurrency.learnt(nodeId),
            **node.counts,
            "models": models,
            "events": [
                {"at": int(at * 1000), "event": what, "model": model}
                for at, what, model in list(node.events)[-SHOWN_EVENTS:]
            ],
        }
