"""Prometheus gauges of the live state, read when ``/metrics`` is scraped.

``StateCollector`` reads in-flight counts, reservations, workloads, discovery, the upstream
pool and conversation affinity from the process (``IOpsView``) at scrape time only, so
keeping them costs the request path nothing (the event counters are ``ops.metrics``').
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nvpair.proxy.ops.enginegauges import engineFamilies
from nvpair.proxy.ops.interfaces import IOpsView
from nvpair.proxy.ops.residencyview import residencyFamilies
from nvpair.proxy.placement.affinity import Affinity

WORKLOAD_STATES = ("completed", "failed", "cancelled")


class StateCollector(Collector):
    """Scrape-time gauges read straight from the process's live state."""

    def __init__(self, view: IOpsView) -> None:
        self.view = view

    def describe(self) -> list[Metric]:
        """Nothing to check at registration: the names are fixed and unique to this module."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield the live-state families."""
        view = self.view
        inFlight = GaugeMetricFamily(
            "nvpair_proxy_in_flight", "Dispatches in flight per node.", labels=["node"]
        )
        for nodeId, count in sorted(view.context.activity.inFlight.items()):
            inFlight.add_metric([nodeId], count)
        yield inFlight
        reservations = view.context.reservations
        reserved = GaugeMetricFamily(
            "nvpair_proxy_reservations",
            "Live reservations per node against the current scheduler generation.",
            labels=["node"],
        )
        byNode = reservations.byNode()
        for nodeId, count in sorted(byNode.items()):
            reserved.add_metric([nodeId], count)
        yield reserved
        load = GaugeMetricFamily(
            "nvpair_proxy_estimated_load",
            "Scheduler pending + gpuPressure + live reservations, per node.",
            labels=["node"],
        )
        for nodeId in sorted(set(reservations.order) | set(byNode)):
            load.add_metric([nodeId], reservations.estimatedLoad(nodeId))
        yield load
        if reservations.generation is not None:
            yield GaugeMetricFamily(
                "nvpair_proxy_scheduler_generation",
                "The applied scheduler snapshot generation.",
                value=reservations.generation,
            )
        yield GaugeMetricFamily(
            "nvpair_proxy_requests_in_progress",
            "Requests being dispatched or streamed now.",
            value=len(view.context.exchanges),
        )
        reporter = view.context.reporter
        terminals = CounterMetricFamily(
            "nvpair_proxy_workloads", "Workloads ended, by terminal state.", labels=["state"]
        )
        states = dict.fromkeys(WORKLOAD_STATES, 0)
        states.update(reporter.terminals)
        for state, count in sorted(states.items()):
            terminals.add_metric([state], count)
        yield terminals
        yield GaugeMetricFamily(
            "nvpair_proxy_workloads_live",
            "Workloads admitted and not yet ended.",
            value=reporter.live,
        )
        pool = view.upstream.pool
        idle, hosts = pool.connectionCounts()
        yield CounterMetricFamily(
            "nvpair_proxy_upstream_bytes_after_answer",
            "Engine answers followed by bytes nobody asked for: each answer stood as framed "
            "and its connection was closed, never pooled.",
            value=pool.answersOverrun,
        )
        yield GaugeMetricFamily(
            "nvpair_proxy_upstream_pool_connections",
            "Idle persistent upstream connections held by the shared pool.",
            value=idle,
        )
        yield GaugeMetricFamily(
            "nvpair_proxy_upstream_pool_hosts",
            "Upstream addresses with idle pooled connections.",
            value=hosts,
        )
        nodes = GaugeMetricFamily(
            "nvpair_proxy_discovery_nodes",
            "Nodes in each facade's discovery snapshot.",
            labels=["engine"],
        )
        updates = CounterMetricFamily(
            "nvpair_proxy_discovery_updates",
            "Discovery snapshots applied, per facade.",
            labels=["engine"],
        )
        for engineId, facade in sorted(view.facades.items()):
            nodes.add_metric([engineId], len(facade.snapshot.nodes))
            updates.add_metric([engineId], facade.snapshotCount)
        yield nodes
        yield updates
        affinity = view.context.affinity
        if affinity is not None:
            yield from _affinityFamilies(affinity)
        engineStates = view.context.engineStates
        if engineStates is not None:
            yield from engineFamilies(engineStates, affinity)
            if engineStates.residency is not None:
                yield from residencyFamilies(engineStates.residency)


def _affinityFamilies(affinity: Affinity) -> Iterator[Metric]:
    """Conversation affinity: placements by outcome per engine, and the table's size."""
    placements = CounterMetricFamily(
        "nvpair_proxy_affinity_placements",
        "Standalone placements by conversation affinity: hit (home first), miss (no home "
        "known or home not an owner), overridden (home overloaded).",
        labels=["engine", "result"],
    )
    for engineId in sorted(affinity.counts):
        for result, count in affinity.countsOf(engineId).items():
            placements.add_metric([engineId, result], count)
    yield placements
    yield GaugeMetricFamily(
        "nvpair_proxy_affinity_entries",
        "Conversation digests held by the affinity table.",
        value=len(affinity.table),
    )
