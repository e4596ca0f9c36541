"""Prometheus gauges of the engines' own state and the prefix index (standalone, spec §11.2),
read at scrape time from ``EngineStates`` and ``Affinity``."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.affinity import Affinity


def engineFamilies(states: EngineStates, affinity: Affinity | None) -> Iterator[Metric]:
    """Per node: slots busy/total/available, whether its state is fresh, prompt and cached
    prompt tokens its engine reported and their ratio; the prefix index's size."""
    busy = GaugeMetricFamily(
        "nvpair_proxy_engine_slots_busy", "Slots busy as the engine last reported.", labels=["node"]
    )
    total = GaugeMetricFamily(
        "nvpair_proxy_engine_slots_total", "Slots the engine reported having.", labels=["node"]
    )
    available = GaugeMetricFamily(
        "nvpair_proxy_engine_slots_available",
        "Free slots now by the room ledger: the least of what the engine reported, the "
        "fleet file's max_concurrency and a limit learnt from busy answers, less ours.",
        labels=["node"],
    )
    fresh = GaugeMetricFamily(
        "nvpair_proxy_engine_state_fresh",
        "1 when the engine's state was read within two probe intervals, else 0 (unknown).",
        labels=["node"],
    )
    prompt = CounterMetricFamily(
        "nvpair_proxy_engine_prompt_tokens",
        "Prompt tokens of answers whose engine reported a cached count.",
        labels=["node"],
    )
    cached = CounterMetricFamily(
        "nvpair_proxy_engine_cached_prompt_tokens",
        "Prompt tokens the engine reported served from its cache.",
        labels=["node"],
    )
    ratio = GaugeMetricFamily(
        "nvpair_proxy_engine_cache_hit_ratio",
        "Cached over prompt tokens the engine reported, since start.",
        labels=["node"],
    )
    for nodeId, entry in states.status().items():
        fresh.add_metric([nodeId], 1 if entry.get("state") == "fresh" else 0)
        for family, field in ((busy, "slotsBusy"), (total, "slotsTotal")):
            value = entry.get(field)
            if isinstance(value, int):
                family.add_metric([nodeId], value)
        value = entry.get("slotsAvailable")
        if isinstance(value, int):
            available.add_metric([nodeId], value)
        counts = states.cache.get(nodeId)
        if counts is not None:
            prompt.add_metric([nodeId], counts.prompt)
            cached.add_metric([nodeId], counts.cached)
            hit = states.hitRatio(nodeId)
            if hit is not None:
                ratio.add_metric([nodeId], hit)
    yield from (busy, total, available, fresh, prompt, cached, ratio)
    if affinity is not None:
        yield GaugeMetricFamily(
            "nvpair_proxy_prefix_index_blocks",
            "Prompt block digests held by the prefix index, over all nodes.",
            value=len(affinity.index),
        )
