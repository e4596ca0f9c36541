"""A Prometheus text exposition read back as samples keyed by name and label set."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """A Prometheus text exposition as {(sample name, label items): value}."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


def labels(**kw: str) -> frozenset[tuple[str, str]]:
    """A label set key for ``Samples``."""
    return frozenset(kw.items())
