"""Tests for nvpair.proxy.ops.metrics: the request-path hooks and what they count."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import REGISTRY
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.dispatch.outcome import Failed
from nvpair.proxy.endings import FailureKind
from nvpair.proxy.engines import ENGINES
from nvpair.proxy.ops import metrics
from nvpair.proxy.ops.metrics import Metrics, requestOutcome
from nvpair.proxy.routing.nodes import Node


def sampleValues(registry: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``registry`` keyed by (sample name, label items)."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in registry.collect():
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


def value(registry: Any, name: str, **labels: str) -> float | None:
    """One sample's value, or None when the series does not exist."""
    return sampleValues(registry).get((name, frozenset(labels.items())))


def exchange(
    engine: str = "llamacpp",
    inference: bool = True,
    committedStatus: int | None = None,
    answered: bool = False,
    clientGone: bool = False,
) -> Any:
    """A stand-in for ``dispatch.Exchange`` with the attributes the hooks read."""
    return SimpleNamespace(
        engine=ENGINES[engine],
        inference=inference,
        committedStatus=committedStatus,
        answered=answered or committedStatus is not None,
        clientGone=clientGone,
    )


def failure(kind: str, status: int | None = None) -> Failed:
    """An uncommitted attempt's outcome on node ``A``."""
    return Failed(FailureKind(kind), Node("A", False, ("http://a:1",), frozenset()), status)


class OutcomeTests(SynchronousTestCase):
    """requestOutcome names how an exchange ended."""

    def test_committedStatusClass(self) -> None:
        """A committed response counts by its status class."""
        self.assertEqual(requestOutcome(exchange(committedStatus=200)), "2xx")
        self.assertEqual(requestOutcome(exchange(committedStatus=404)), "4xx")
        self.assertEqual(requestOutcome(exchange(committedStatus=503)), "5xx")

    def test_proxyAnswered(self) -> None:
        """A response the proxy generated itself is an ``error``."""
        self.assertEqual(requestOutcome(exchange(answered=True)), "error")

    def test_clientGone(self) -> None:
        """A client that left before the end is ``cancelled``, committed or not."""
        self.assertEqual(requestOutcome(exchange(clientGone=True)), "cancelled")
        self.assertEqual(
            requestOutcome(exchange(committedStatus=200, clientGone=True)), "cancelled"
        )

    def test_unanswered(self) -> None:
        """An exchange that ended with no answer and its client present (shutdown) is cancelled."""
        self.assertEqual(requestOutcome(exchange()), "cancelled")


class HookTests(SynchronousTestCase):
    """Each hook moves exactly the series it names."""

    def setUp(self) -> None:
        self.metrics = Metrics()
        self.registry = self.metrics.registry

    def test_ownRegistry(self) -> None:
        """Metrics live in a registry of their own, not the process-global one."""
        self.assertIsNot(self.registry, REGISTRY)
        names = {family.name for family in REGISTRY.collect()}
        self.assertNotIn("nvpair_proxy_requests", names)
        Metrics()  # a second instance registers nothing twice

    def test_prebound(self) -> None:
        """Request and attempt series exist at zero before any traffic (rate() works at once)."""
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_requests_total",
                engine="ollama",
                route="inference",
                outcome="2xx",
            ),
            0.0,
        )
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_dispatch_attempts_total",
                engine="lmstudio",
                reason="no_content",
            ),
            0.0,
        )

    def test_requestEnded(self) -> None:
        """requestEnded counts by engine, route class and outcome."""
        self.metrics.requestEnded(exchange(committedStatus=200))
        self.metrics.requestEnded(exchange(committedStatus=201))
        self.metrics.requestEnded(exchange("ollama", inference=False, answered=True))
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_requests_total",
                engine="llamacpp",
                route="inference",
                outcome="2xx",
            ),
            2.0,
        )
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_requests_total",
                engine="ollama",
                route="verbatim",
                outcome="error",
            ),
            1.0,
        )
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_requests_total",
                engine="llamacpp",
                route="verbatim",
                outcome="2xx",
            ),
            0.0,
        )

    def test_attempts(self) -> None:
        """Failed attempts count by their kind; commits count as ``committed``."""
        ex = exchange(committedStatus=200)
        self.metrics.attemptFailed(ex, failure("status", 503))
        self.metrics.attemptFailed(ex, failure("transport"))
        self.metrics.attemptFailed(ex, failure("transport"))
        self.metrics.committed(ex, "B", 0.3)
        for reason, count in (("status", 1), ("transport", 2), ("committed", 1), ("left", 0)):
            self.assertEqual(
                value(
                    self.registry,
                    "nvpair_proxy_dispatch_attempts_total",
                    engine="llamacpp",
                    reason=reason,
                ),
                float(count),
                reason,
            )

    def test_ttftHistogram(self) -> None:
        """committed observes the commit latency in the engine's and route's histogram."""
        self.metrics.committed(exchange(committedStatus=200), "A", 0.3)
        self.metrics.committed(exchange(committedStatus=200), "A", 7.0)
        name = "nvpair_proxy_commit_seconds"
        labels = {"engine": "llamacpp", "route": "inference"}
        self.assertEqual(value(self.registry, name + "_count", **labels), 2.0)
        self.assertAlmostEqual(value(self.registry, name + "_sum", **labels) or 0.0, 7.3)
        self.assertEqual(value(self.registry, name + "_bucket", le="0.25", **labels), 0.0)
        self.assertEqual(value(self.registry, name + "_bucket", le="0.5", **labels), 1.0)
        self.assertEqual(value(self.registry, name + "_bucket", le="10.0", **labels), 2.0)
        self.assertEqual(
            value(self.registry, name + "_count", engine="llamacpp", route="verbatim"), 0.0
        )

    def test_proxyErrors(self) -> None:
        """proxyError counts the proxy's own answers by engine and reason."""
        self.metrics.proxyError("ollama", "no_owner")
        self.metrics.proxyError("ollama", "no_owner")
        self.metrics.proxyError("ollama", "body_too_large")
        self.assertEqual(
            value(self.registry, "nvpair_proxy_errors_total", engine="ollama", reason="no_owner"),
            2.0,
        )
        self.assertEqual(
            value(
                self.registry, "nvpair_proxy_errors_total", engine="ollama", reason="body_too_large"
            ),
            1.0,
        )

    def test_internal(self) -> None:
        """internalError counts unexpected exceptions."""
        self.metrics.internalError()
        self.assertEqual(value(self.registry, "nvpair_proxy_internal_errors_total"), 1.0)

    def test_rpc(self) -> None:
        """Broker messages count by method; error answers by method and code."""
        self.metrics.rpcMessage("facade/enable")
        self.metrics.rpcMessage("facade/enable", -32602)
        self.metrics.rpcMessage("discovery:nodes")
        self.assertEqual(
            value(self.registry, "nvpair_proxy_rpc_messages_total", method="facade/enable"), 2.0
        )
        self.assertEqual(
            value(self.registry, "nvpair_proxy_rpc_messages_total", method="discovery:nodes"), 1.0
        )
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_rpc_errors_total",
                method="facade/enable",
                code="-32602",
            ),
            1.0,
        )
        self.assertIsNone(
            value(
                self.registry,
                "nvpair_proxy_rpc_errors_total",
                method="discovery:nodes",
                code="-32602",
            )
        )

    def test_unknownMethodsShareOneLabel(self) -> None:
        """Unknown method names never become labels of their own (bounded cardinality)."""
        for i in range(100):
            self.metrics.rpcMessage(f"made/up-{i}", -32601)
        self.assertEqual(
            value(self.registry, "nvpair_proxy_rpc_messages_total", method="unknown"), 100.0
        )
        self.assertEqual(
            value(self.registry, "nvpair_proxy_rpc_errors_total", method="unknown", code="-32601"),
            100.0,
        )
        methods = {
            labels
            for (name, labels) in sampleValues(self.registry)
            if name == "nvpair_proxy_rpc_messages_total"
        }
        self.assertEqual(len(methods), 1)

    def test_fleetMerge(self) -> None:
        """fleetMerge counts merges and the nodes that answered or failed."""
        self.metrics.fleetMerge("lmstudio", 2, 1)
        self.metrics.fleetMerge("lmstudio", 3, 0)
        self.assertEqual(
            value(self.registry, "nvpair_proxy_fleet_list_merges_total", engine="lmstudio"), 2.0
        )
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_fleet_list_sources_total",
                engine="lmstudio",
                result="answered",
            ),
            5.0,
        )
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_fleet_list_sources_total",
                engine="lmstudio",
                result="failed",
            ),
            1.0,
        )

    def test_warmHooksBindNothingNew(self) -> None:
        """Once warm, the request-path hooks reuse their label children (no per-call binding)."""
        m = self.metrics
        ex = exchange(committedStatus=200)
        failed = failure("status", 500)
        m.attemptFailed(ex, failed)
        m.committed(ex, "A", 0.1)
        m.requestEnded(ex)
        sizes = (len(m._requestChildren), len(m._attemptChildren), len(m._ttftChildren))
        before = m._requestChildren[("llamacpp", True, "2xx")]
        for _ in range(50):
            m.attemptFailed(ex, failed)
            m.committed(ex, "A", 0.1)
            m.requestEnded(ex)
        self.assertEqual(
            (len(m._requestChildren), len(m._attemptChildren), len(m._ttftChildren)), sizes
        )
        self.assertIs(m._requestChildren[("llamacpp", True, "2xx")], before)
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_requests_total",
                engine="llamacpp",
                route="inference",
                outcome="2xx",
            ),
            51.0,
        )

    def test_commitHistogramMatchesTheLibrary(self) -> None:
        """Commit latencies land in the same buckets (edges, +Inf, zero, negative, NaN) as a
        histogram of the same buckets observing the same amounts directly."""
        from prometheus_client import CollectorRegistry, Histogram

        amounts = [0.005, 0.0051, 0.25, 60.0, 299.9, 300.0, 1e9, 0.0, -1.0, float("nan")]
        reference = CollectorRegistry()
        histogram = Histogram(
            "nvpair_proxy_commit_seconds",
            "x",
            ["engine", "route"],
            buckets=metrics.TTFT_BUCKETS,
            registry=reference,
        )
        child = histogram.labels("llamacpp", "inference")
        ex = exchange(committedStatus=200)
        for amount in amounts:
            child.observe(amount)
            self.metrics.committed(ex, "A", amount)
        name = "nvpair_proxy_commit_seconds"
        for bound in metrics.TTFT_BUCKETS:
            le = "+Inf" if bound == float("inf") else repr(bound)
            self.assertEqual(
                value(self.registry, name + "_bucket", engine="llamacpp", route="inference", le=le),
                value(reference, name + "_bucket", engine="llamacpp", route="inference", le=le),
                le,
            )
        self.assertEqual(
            value(self.registry, name + "_count", engine="llamacpp", route="inference"),
            value(reference, name + "_count", engine="llamacpp", route="inference"),
        )
        self.assertEqual(
            value(
                self.registry,
                "nvpair_proxy_dispatch_attempts_total",
                engine="llamacpp",
                reason="committed",
            ),
            float(len(amounts)),
        )
