"""One node's residency as ``/status`` shows it (spec §11, "Model residency"; the
residency view's ``nodeStatus``): what it holds, in which state, our requests and the
demand on each, what a load costs there, the loads and evictions seen and the last few."""

from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.nodestate.concurrency import ConcurrencyEstimator
from nvpair.proxy.nodestate.holdings import MAX_MODELS, NodeHoldings, residentBytes
from nvpair.proxy.nodestate.interfaces import ModelState
from nvpair.proxy.nodestate.loadcost import LoadCosts
from nvpair.proxy.nodestate.states import EngineStates

__all__ = ["SHOWN_EVENTS", "ResidencyReader", "nodeStatus"]

SHOWN_EVENTS = 8


class ResidencyReader(Protocol):
    """What ``nodeStatus`` reads of the residency view."""

    clock: IReactorTime
    states: EngineStates
    costs: LoadCosts
    concurrency: ConcurrencyEstimator

    def state(self, nodeId: str, model: str) -> ModelState: ...

    def demand(self, model: str, nodeId: str | None = None) -> float: ...


def nodeStatus(view: ResidencyReader, nodeId: str, node: NodeHoldings) -> dict[str, object]:
    """``node`` (``nodeId``'s holdings in ``view``) for ``/status``."""
    now = view.clock.seconds()
    names = sorted(set(node.resident) | {m for m in node.expected if m not in node.resident})
    models = []
    for name in names[:MAX_MODELS]:
        resident = node.resident.get(name)
        models.append(
            {
                "model": name,
                "state": view.state(nodeId, name).value,
                "sinceSeconds": round(now - node.since.get(name, now), 1),
                "running": node.running.get(name, 0),
                "demandPerMinute": round(view.demand(name, nodeId), 2),
                "loadSeconds": round(view.costs.estimate(nodeId, name), 2),
                "sizeBytes": None if resident is None else residentBytes(resident),
            }
        )
    return {
        "fresh": view.states.fresh(nodeId) is not None and node.seen,
        "capacity": node.capacity or None,
        "memoryBytes": node.memory or None,
        "installed": node.installed,
        "parallel": view.concurrency.learnt(nodeId),
        **node.counts,
        "models": models,
        "events": [
            {"at": int(at * 1000), "event": what, "model": model}
            for at, what, model in list(node.events)[-SHOWN_EVENTS:]
        ],
    }
