"""Which models each node holds, on ``/status``, ``/metrics`` and the page (standalone; spec
§11, "Model residency").  The live script (``static/ops.js``: ``residencyNote``) draws the
page's line the same way."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nvpair.proxy.facade.modelactor import ModelActions
from nvpair.proxy.nodestate.interfaces import IResidency
from nvpair.proxy.ops.documents import StatusDocument
from nvpair.proxy.ops.format import esc, number

SHOWN_MODELS = 4  # named on the page; the rest counted
METRIC_MODELS = 32  # per node in nvpair_proxy_model_loaded


def residencyStatus(residency: IResidency, actions: ModelActions | None) -> dict[str, object]:
    """``/status`` ``residency``: every node's models and loads, and what the fleet file lets
    the proxy do (``preload``, ``unload_idle``) with what it did."""
    document = dict(residency.snapshot())
    document["actions"] = None if actions is None else actions.status()
    return document


def _nodes(residency: IResidency) -> Mapping[str, Mapping[str, object]]:
    nodes = residency.snapshot().get("nodes")
    return nodes if isinstance(nodes, dict) else {}


def residencyFamilies(residency: IResidency) -> Iterator[Metric]:
    """Per node: loads and evictions seen, the models it holds (1 loaded, 0 loading or
    asleep; at most ``METRIC_MODELS`` per node) and how many it was seen holding at once."""
    loads = CounterMetricFamily(
        "nvpair_proxy_model_loads",
        "Models seen appearing on a node (loads), from its engine's own state.",
        labels=["node"],
    )
    evictions = CounterMetricFamily(
        "nvpair_proxy_model_evictions",
        "Models seen disappearing from a node before their keep-alive ran out, not asked by "
        "the proxy.",
        labels=["node"],
    )
    loaded = GaugeMetricFamily(
        "nvpair_proxy_model_loaded",
        "Models a node holds: 1 loaded, 0 loading or asleep.",
        labels=["node", "model"],
    )
    capacity = GaugeMetricFamily(
        "nvpair_proxy_node_model_capacity",
        "The most models a node was seen holding at once.",
        labels=["node"],
    )
    for nodeId, entry in sorted(_nodes(residency).items()):
        loads.add_metric([nodeId], _int(entry.get("loads")))
        evictions.add_metric([nodeId], _int(entry.get("evictions")))
        if entry.get("capacity"):
            capacity.add_metric([nodeId], _int(entry.get("capacity")))
        models = entry.get("models")
        for model in (models if isinstance(models, list) else [])[:METRIC_MODELS]:
            value = 1 if model["state"] == "loaded" else 0
            loaded.add_metric([nodeId, str(model["model"])], value)
    yield from (loads, evictions, loaded, capacity)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _plural(count: int, word: str) -> str:
    return f"{number(count)} {word}{'' if count == 1 else 's'}"


def residencyNote(status: StatusDocument, nodeId: str) -> str:
    """A node's line on the page: the models it holds (with their state when not loaded),
    then the loads and evictions seen; nothing without a residency entry."""
    residency = status.get("residency")
    nodes = residency.get("nodes") if isinstance(residency, dict) else None
    entry = nodes.get(nodeId) if isinstance(nodes, dict) else None
    if not isinstance(entry, dict) or not entry:
        return ""
    models = entry["models"]
    names = [
        m["model"] if m["state"] == "loaded" else f"{m['model']} ({m['state']})"
        for m in models[:SHOWN_MODELS]
    ]
    if len(models) > SHOWN_MODELS:
        names.append(f"+{len(models) - SHOWN_MODELS}")
    parts = []
    if names:
        parts.append("holds " + ", ".join(names))
    elif entry["fresh"]:
        parts.append("holds no model")
    loads, evictions = _int(entry["loads"]), _int(entry["evictions"])
    if loads or evictions:
        parts += [_plural(loads, "load"), _plural(evictions, "eviction")]
    if not parts:
        return ""
    return f'<div class="resident">{esc(" · ".join(parts))}</div>'
