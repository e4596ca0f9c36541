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
* **What a node can hold**: the most models (and, where sizes are reported, bytes) it was
  seen holding at once; a lower bound until it was seen evicting.
* **What a load would evict**: the least recently used resident model with no request of
  ours running; when all are busy, the busy copy of a model resident elsewhere with the
  least fleet demand per copy (it drains), else the least recently used one.
* **Demand**: requests per minute per (node, model), counted as they start there, and per
  model over the fleet, counted as they arrive (waiting for a load or not): ``Demand``.
* **Parallel slots** per model (``modelFull``, ``nodeParallel``): the instance's figure
  (LM Studio), else learnt (``ConcurrencyEstimator``, from our requests per model there).

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
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.residencystatus import nodeStatus
from nvpair.proxy.nodestate.states import EngineStates

__all__ = ["Residency"]

MAX_NODES = 256
MAX_DEMAND_MODELS = 1024
EXPECT_FACTOR = 3.0
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
        self.concurrency = ConcurrencyEstimator(clock, service=ledger.serviceTime)
        self._nodes: dict[str, NodeHoldings] = {}
        self._demand = Demand(MAX_DEMAND_MODELS)
        self._sizes: dict[str, int] = {}  # model -> bytes, as last reported anywhere
        self.actions: IModelActions | None = None  # unloads via engine APIs (``model-actions``)

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
        for name, seconds in node.listed(report, now):
            self.costs.observe(nodeId, name, seconds, LoadEvidence.TRANSITION)
        for name, model in node.resident.items():
            size = residentBytes(model)
            if size is not None and (name in self._sizes or len(self._sizes) < MAX_DEMAND_MODELS):
                self._sizes[name] = size

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

    def requested(self, model: str) -> None:
        """A request for ``model`` arrived: the fleet's demand, waiting requests counted."""
        self._demand.bump(model, self.clock.seconds())

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
        now = self.clock.seconds()
        if left <= 0 and model in node.evicting:
            node.evicting[model] = now  # drained: the engine evicts it now, a probe says
        self._use(node, model, now)

    def _use(self, node: NodeHoldings, model: str, now: float) -> None:
        if model in node.used or len(node.used) < MAX_MODELS:
            node.used[model] = now

    def loadStarted(self, nodeId: str, model: str) -> None:
        """The proxy started a load of ``model`` on ``nodeId`` (it is ``loading`` now); the
        model it will likely evict there is taken as gone until a probe says: an idle one
        (unloaded through the engine's API first where the fleet file says
        ``unload_idle``), or a busy one resident elsewhere too or with room elsewhere to
        move to, which drains (no request of ours goes to it there, so the engine can
        evict it)."""
        eviction = self.likelyEviction(nodeId, model)
        node = self._node(nodeId)
        if node is not None and (model in node.expected or len(node.expected) < MAX_MODELS):
            node.expected[model] = self.clock.seconds()
        if node is None or eviction is None:
            return
        if not (eviction.idle or eviction.copies > 1 or self.roomElsewhere(nodeId)):
            return  # a busy only copy with nowhere else to go: the load waits for it
        node.evicting[eviction.model] = self.clock.seconds()  # a busy one drains first
        actions = self.actions  # ``unload_idle``: make the room through its API first
        if eviction.idle and actions is not None and actions.allowsUnload(nodeId):
            actions.unload(nodeId, eviction.model)

    def loadAbandoned(self, nodeId: str, model: str) -> None:
        """The request that was to load ``model`` on ``nodeId`` failed: no load expected."""
        node = self._nodes.get(nodeId)
        if node is not None:
            node.expected.pop(model, None)

    def loadDone(self, nodeId: str, model: str, seconds: float | None = None) -> None:
        """A load of ``model`` on ``nodeId`` is done, having taken ``seconds`` (None: not known)."""
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
        """A request that found ``model`` cold had its first byte after ``seconds``: loaded."""
        self.costs.observe(nodeId, model, seconds, LoadEvidence.FIRST_BYTE)
        self.loadDone(nodeId, model)

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
        resident = self._nodes[nodeId].resident.get(model) if nodeId in self._nodes else None
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
            return ModelState.UNKNOWN  # nothing listed, no load of ours: as the rules say
        return self.rules(nodeId, node, model)

    def rules(self, nodeId: str, node: NodeHoldings, model: str) -> ModelState:
        """``model``'s state on ``nodeId`` (``node``) by every rule in order (``state``
        answers early where they can only say unknown)."""
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

    def _holding(self, nodeId: str, node: NodeHoldings) -> set[str]:
        """The models ``node`` holds: resident, loading by us, or loaded and not yet listed."""
        now = self.clock.seconds()
        held = set(node.resident)
        held.update(m for m in list(node.expected) if self._expecting(nodeId, node, m, now))
        held.update(m for m in list(node.done) if self._done(node, m, now))
        return held

    def held(self, nodeId: str) -> int:
        node = self._nodes.get(nodeId)
        return 0 if node is None else len(self._holding(nodeId, node))

    def mostHeld(self, nodeId: str) -> int:
        node = self._nodes.get(nodeId)
        return 0 if node is None else node.capacity

    def room(self, nodeId: str) -> int | None:
        node = self._nodes.get(nodeId)
        if node is None or node.capacity == 0 or self.states.fresh(nodeId) is None:
            return None
        return max(0, node.capacity - len(self._holding(nodeId, node)))

    def _fits(self, nodeId: str, node: NodeHoldings, model: str) -> bool:
        if len(self._holding(nodeId, node)) < node.capacity:
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
        if state is ModelState.UNKNOWN or self._fits(nodeId, node, model):
            return None
        if not node.full and len(self._holding(nodeId, node)) < max(2, self._mostSeen()):
            return None  # a lower bound: it may well have room
        order = sorted(
            (m for m in node.resident if m != model),
            key=lambda m: (node.used.get(m, -math.inf), node.resident[m].until or "",
                           node.since.get(m, 0.0)),
        )  # fmt: skip
        if not order:
            return None
        idle = [m for m in order if not node.running.get(m)]
        if idle:
            return self._eviction(nodeId, idle[0], True)
        busy = [self._eviction(nodeId, m, False) for m in order]
        copied = [e for e in busy if e.copies > 1]
        return min(copied, key=lambda e: e.fleetDemand / e.copies) if copied else busy[0]

    def _eviction(self, nodeId: str, victim: str, idle: bool) -> Eviction:
        copies = len(self.holders(victim))
        return Eviction(victim, idle, self.demand(victim, nodeId), self.demand(victim), copies)

    def demand(self, model: str, nodeId: str | None = None) -> float:
        now = self.clock.seconds()
        if nodeId is None:
            return self._demand.perMinute(model, now)
        node = self._nodes.get(nodeId)
        return 0.0 if node is None else node.demand.perMinute(model, now)

    def holders(self, model: str) -> tuple[str, ...]:
        held = (ModelState.LOADED, ModelState.LOADING)
        return tuple(n for n in self._nodes if self.state(n, model) in held)

    def _mostSeen(self) -> int:
        return max((node.capacity for node in self._nodes.values()), default=0)

    def roomElsewhere(self, nodeId: str) -> bool:
        most = self._mostSeen()
        for other, node in self._nodes.items():
            if other == nodeId or self.states.fresh(other) is None:
                continue
            count = len(self._holding(other, node))
            if count < node.capacity or (not node.full and count < most):
                return True
        return False

    def neediest(self) -> float:
        models = {m for n, node in self._nodes.items() for m in self._holding(n, node)}
        return max((self.demand(m) / (len(self.holders(m)) + 1) for m in models), default=0.0)

    def residentDemand(self, nodeId: str) -> float:
        node = self._nodes.get(nodeId)
        if node is None:
            return 0.0
        held = self._holding(nodeId, node)
        return max((self.demand(m) / max(1, len(self.holders(m))) for m in held), default=0.0)

    def parallel(self, nodeId: str, model: str) -> int | None:
        limit = self.ledger.configured(nodeId)
        return self._perModel(nodeId, model) if limit is None else limit

    def _perModel(self, nodeId: str, model: str) -> int | None:
        if self.ledger.reportsSlots(nodeId):
            return None  # an engine reporting its slots is read, not second-guessed
        node = self._nodes.get(nodeId)
        resident = None if node is None else node.resident.get(model)
        if resident is not None and resident.parallel is not None:
            return resident.parallel
        return self.concurrency.learnt(nodeId)

    def modelFull(self, nodeId: str, model: str) -> bool:
        running = self.running(nodeId, model)
        limit = self._perModel(nodeId, model) if running else None
        return limit is not None and running >= limit

    def nodeParallel(self, nodeId: str) -> int | None:
        """The room ledger's limit: the learnt per-model figure × the models held (≥ 1)."""
        learnt, node = self.concurrency.learnt(nodeId), self._nodes.get(nodeId)
        held = 1 if learnt is None or node is None else len(self._holding(nodeId, node))
        return None if learnt is None else learnt * max(1, held)

    # -- /status --

    def snapshot(self) -> dict[str, object]:
        """``/status`` ``residency``: per node what it holds, loads and evictions seen."""
        nodes = {nodeId: self.nodeStatus(nodeId) for nodeId in sorted(self._nodes)}
        return {"defaultLoadSeconds": DEFAULT_LOAD_SECONDS, "nodes": nodes}

    def nodeStatus(self, nodeId: str) -> dict[str, object]:
        """One node's residency for ``/status`` (each facade node's ``residency``)."""
        node = self._nodes.get(nodeId)
        return {} if node is None else nodeStatus(self, nodeId, node)
