"""The queue and the node breakers, as ``/metrics`` and ``/status`` show them (standalone;
read at scrape time from ``dispatch.queueing.Queueing``, nothing kept here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from nvpair.proxy.dispatch.queueing import Queueing
from nvpair.proxy.flow.breaker import BreakerState
from nvpair.proxy.flow.waits import WAIT_BUCKETS

_STATE_VALUE = {"closed": 0, "half-open": 1, "open": 2}


class QueueCollector(Collector):
    """Scrape-time families of the queue and the breakers (none under a broker)."""

    def __init__(self, queueing: Callable[[], Queueing | None]) -> None:
        self.queueing = queueing

    def describe(self) -> list[Metric]:
        """Nothing to check at registration: the names are unique to this module."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield depth, wait histogram, refusals, breaker state and opens."""
        queueing = self.queueing()
        if queueing is None:
            return
        depth = GaugeMetricFamily(
            "nvpair_proxy_queue_depth",
            "Requests waiting in the proxy's queue, per facade and model.",
            labels=["engine", "model"],
        )
        wait = HistogramMetricFamily(
            "nvpair_proxy_queue_wait_seconds",
            "Time requests let out of the queue had waited, per facade and model.",
            labels=["engine", "model"],
        )
        for engine, model, size, _, waits in queueing.depths():
            depth.add_metric([engine, model], size)
            buckets: list[tuple[str, float]] = []
            running = 0
            for bound, count in zip((*map(str, WAIT_BUCKETS), "+Inf"), waits.counts, strict=True):
                running += count
                buckets.append((bound, running))
            wait.add_metric([engine, model], buckets, waits.total)
        yield depth
        yield wait
        refused = CounterMetricFamily(
            "nvpair_proxy_queue_refusals",
            "Requests the queue refused, per facade and reason (queue_full, queue_timeout, "
            "deadline_exceeded).",
            labels=["engine", "reason"],
        )
        for (engine, reason), count in sorted(refusals(queueing)):
            refused.add_metric([engine, reason], count)
        yield refused
        yield from _clientFamilies(queueing)
        holds = queueing.holds
        yield GaugeMetricFamily(
            "nvpair_proxy_held_requests",
            "Requests held in the proxy now for their prefix holder's next free slot.",
            value=len(holds),
        )
        ended = CounterMetricFamily(
            "nvpair_proxy_holds",
            "Holds for a prefix holder that ended: room (the holder had a free slot) or "
            "budget (waited as long as recomputing takes: recomputed elsewhere).",
            labels=["result"],
        )
        for result, count in (("room", holds.endedWithRoom), ("budget", holds.endedWithBudget)):
            ended.add_metric([result], count)
        yield ended
        now = queueing.clock.seconds()
        state = GaugeMetricFamily(
            "nvpair_proxy_breaker_state",
            "Node breaker state: 0 closed, 1 half-open, 2 open (nodes with recent failures).",
            labels=["node"],
        )
        opens = CounterMetricFamily(
            "nvpair_proxy_breaker_opens",
            "Times a node's breaker opened (per node while it is tracked).",
            labels=["node"],
        )
        for nodeId, entry in sorted(queueing.breakers.snapshot(now).items()):
            state.add_metric([nodeId], _STATE_VALUE[str(entry["state"])])
            opens.add_metric([nodeId], float(str(entry["opens"])))
        yield state
        yield opens
        yield CounterMetricFamily(
            "nvpair_proxy_breaker_opens_all",
            "Times any node's breaker opened since the start.",
            value=queueing.breakers.opened,
        )


def refusals(queueing: Queueing) -> Iterator[tuple[tuple[str, str], int]]:
    """The queue's refusals per facade and reason, the reason as its code."""
    for (engine, reason), count in queueing.refused.items():
        yield (engine, reason.value), count


def clientRefusals(queueing: Queueing) -> Iterator[tuple[tuple[str, str, str], int]]:
    """The queue's refusals per facade, client label and reason, the reason as its code."""
    for (engine, label, reason), count in queueing.clients.refused.items():
        yield (engine, label, reason.value), count


def clientDepths(queueing: Queueing) -> list[tuple[str, str, str, int]]:
    """Per facade, model and client label with requests waiting: how many wait."""
    rows: list[tuple[str, str, str, int]] = []
    roster = queueing.clients.roster
    for (engine, model), line in queueing.lines.items():
        counts: dict[str, int] = {}
        for share, waiting in line.queue.waitingBy().items():
            label = roster.label(share)
            counts[label] = counts.get(label, 0) + waiting
        rows.extend((engine, model, label, n) for label, n in sorted(counts.items()))
    return rows


def _clientFamilies(queueing: Queueing) -> Iterator[Metric]:
    """Per declared client (by name), ``unverified`` and ``other``: waiting, dispatched,
    refused (spec §11 "The queue", "Seen")."""
    depth = GaugeMetricFamily(
        "nvpair_proxy_queue_client_depth",
        "Requests waiting in the proxy's queue, per facade, model and client (a declared "
        "name, unverified, or other: a name a reload removed).",
        labels=["engine", "model", "client"],
    )
    for engine, model, label, waiting in clientDepths(queueing):
        depth.add_metric([engine, model, label], waiting)
    yield depth
    dispatched = CounterMetricFamily(
        "nvpair_proxy_queue_client_dispatches",
        "Requests sent on to the engines under the queue's fairness (waited or not), per "
        "facade and client.",
        labels=["engine", "client"],
    )
    for (engine, label), count in sorted(queueing.clients.dispatched.items()):
        dispatched.add_metric([engine, label], count)
    yield dispatched
    refused = CounterMetricFamily(
        "nvpair_proxy_queue_client_refusals",
        "Requests the queue refused, per facade, client and reason.",
        labels=["engine", "client", "reason"],
    )
    for (engine, label, reason), count in sorted(clientRefusals(queueing)):
        refused.add_metric([engine, label, reason], count)
    yield refused


def clientStatus(queueing: Queueing) -> dict[str, dict[str, dict[str, object]]]:
    """``/status`` ``queueing.clients``: per facade and client label, requests waiting now,
    dispatched and refused by reason (declared names, ``unverified``, ``other``)."""
    waiting: dict[tuple[str, str], int] = {}
    for engine, _, label, count in clientDepths(queueing):
        waiting[engine, label] = waiting.get((engine, label), 0) + count
    refused: dict[tuple[str, str], dict[str, int]] = {}
    for (engine, label, reason), count in sorted(clientRefusals(queueing)):
        refused.setdefault((engine, label), {})[reason] = count
    dispatched = queueing.clients.dispatched
    clients: dict[str, dict[str, dict[str, object]]] = {}
    for engine, label in sorted({*waiting, *dispatched, *refused}):
        clients.setdefault(engine, {})[label] = {
            "waiting": waiting.get((engine, label), 0),
            "dispatched": dispatched.get((engine, label), 0),
            "refused": refused.get((engine, label), {}),
        }
    return clients


def queueStatus(queueing: Queueing | None) -> dict[str, object] | None:
    """``/status``'s ``queueing`` object: the bounds, per facade and model its depth, the
    longest current wait and the last wait; refusals; per node its breaker."""
    if queueing is None:
        return None
    now = queueing.clock.seconds()
    queues: dict[str, dict[str, dict[str, object]]] = {}
    for engine, model, size, oldest, waits in queueing.depths():
        queues.setdefault(engine, {})[model] = {
            "depth": size,
            "oldestWaitSeconds": round(oldest, 3),
            "lastWaitSeconds": round(waits.last, 3),
            "dispatched": waits.count,
        }
    refused: dict[str, dict[str, int]] = {}
    for (engine, reason), count in sorted(refusals(queueing)):
        refused.setdefault(engine, {})[reason] = count
    return {
        "queueMax": queueing.settings.queueMax,
        "queueTimeoutSeconds": queueing.settings.queueTimeout,
        "queues": queues,
        "refused": refused,
        "declaredClients": sorted(queueing.clients.roster.names),
        "clients": clientStatus(queueing),
        "held": {
            "now": len(queueing.holds),
            "endedWithRoom": queueing.holds.endedWithRoom,
            "endedWithBudget": queueing.holds.endedWithBudget,
        },
        "breakers": queueing.breakers.snapshot(now),
        "breakerStates": [s.value for s in BreakerState],
    }
