"""Prometheus metrics: the request-path event counters.

``Metrics`` holds the counters and the commit-latency histogram the request path feeds,
in a ``CollectorRegistry`` of its own (never the process-global one).  Its hooks run on
the request path, so each is a dict lookup of a pre-bound label child plus one increment;
every label set is bounded (engine ids, route classes, fixed outcome and reason words,
JSON-RPC names the service knows).  The live state is read when ``/metrics`` is scraped
(``ops.gauges``), so keeping it costs the request path nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.facade.reload import COUNTED, ReloadResult
from nvpair.proxy.hooks import HOOKS, RequestObserver

if TYPE_CHECKING:
    from nvpair.proxy.interfaces import IAttemptReport, IExchangeReport

# A label child's bound ``inc`` (or a histogram child's ``observe``).
_Count = Callable[[float], None]

ROUTES = {True: "inference", False: "verbatim"}
OUTCOMES = ("2xx", "3xx", "4xx", "5xx", "error", "cancelled")
ATTEMPT_REASONS = ("committed", "transport", "status", "no_content", "left", "moved")
TTFT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    float("inf"),
)
METHOD_NOT_FOUND = -32601
_STATUS_CLASS = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


def requestOutcome(exchange: IExchangeReport) -> str:
    """How an exchange ended: committed status class, ``error`` (proxy answer) or ``cancelled``."""
    status = exchange.committedStatus
    if exchange.clientGone or (status is None and not exchange.answered):
        return "cancelled"
    if status is None:
        return "error"
    return _STATUS_CLASS.get(status // 100, "other")


class Metrics(RequestObserver):
    """The event metrics of one process, an observer of every request (``hooks``); hooks
    are cheap and allocate nothing once warm."""

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry()
        self._requests = Counter(
            "nvpair_proxy_requests",
            "Dispatched requests by engine, route class and outcome.",
            ["engine", "route", "outcome"],
            registry=registry,
        )
        self._attempts = Counter(
            "nvpair_proxy_dispatch_attempts",
            "Dispatch attempts by engine and how they ended (committed or why not).",
            ["engine", "reason"],
            registry=registry,
        )
        self._ttft = Histogram(
            "nvpair_proxy_commit_seconds",
            "Time from admission to commit (first content byte), seconds.",
            ["engine", "route"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self._proxyErrors = Counter(
            "nvpair_proxy_errors",
            "Responses the proxy generated itself, by engine and reason.",
            ["engine", "reason"],
            registry=registry,
        )
        self._internal = Counter(
            "nvpair_proxy_internal_errors",
            "Unexpected exceptions while handling a request.",
            registry=registry,
        )
        self._rpc = Counter(
            "nvpair_proxy_rpc_messages",
            "JSON-RPC messages handled from the broker, by method.",
            ["method"],
            registry=registry,
        )
        self._rpcErrors = Counter(
            "nvpair_proxy_rpc_errors",
            "JSON-RPC error answers to the broker, by method and code.",
            ["method", "code"],
            registry=registry,
        )
        self._fleetMerges = Counter(
            "nvpair_proxy_fleet_list_merges",
            "Fleet-wide model lists merged, by engine.",
            ["engine"],
            registry=registry,
        )
        self._fleetSources = Counter(
            "nvpair_proxy_fleet_list_sources",
            "Nodes asked for a fleet model list, by engine and whether they answered.",
            ["engine", "result"],
            registry=registry,
        )
        self._hostDenied = Counter(
            "nvpair_proxy_host_denied",
            "Plaintext requests refused because Host is not a loopback name, by listener.",
            ["listener"],
            registry=registry,
        )
        for listener in (*ENGINES, "ops"):
            self._hostDenied.labels(listener)  # every series present from the start, at 0
        self._stalled = Counter(
            "nvpair_proxy_streams_stalled",
            "Committed streams cut because the engine sent nothing for --stream-idle-timeout.",
            ["engine"],
            registry=registry,
        )
        self._hookErrors = Counter(
            "nvpair_proxy_hook_errors",
            "Exceptions raised by a request observer (metrics, history, queue, cache "
            "accounting), by hook: logged once each, the request and the others unaffected.",
            ["hook"],
            registry=registry,
        )
        for hook in HOOKS:
            self._hookErrors.labels(hook)
        self._fleetReloads = Counter(
            "nvpair_proxy_fleet_reloads",
            "Fleet file loads after the first (standalone --fleet), by result.",
            ["result"],
            registry=registry,
        )
        for result in COUNTED:
            self._fleetReloads.labels(result.value)
        self._requestChildren: dict[tuple[str, bool, str], _Count] = {}
        self._attemptChildren: dict[tuple[str, str], _Count] = {}
        self._ttftChildren: dict[tuple[str, bool], _Count] = {}
        self._errorChildren: dict[tuple[str, str], Counter] = {}
        self._rpcChildren: dict[str, Counter] = {}
        self._internalChild = self._internal
        # The request-path hooks keep each label child's bound ``inc`` (or ``observe``).
        for engine in ENGINES:
            for inference, route in ROUTES.items():
                self._ttftChildren[engine, inference] = self._ttft.labels(engine, route).observe
                for outcome in OUTCOMES:
                    self._requestChildren[engine, inference, outcome] = self._requests.labels(
                        engine, route, outcome
                    ).inc
            for reason in ATTEMPT_REASONS:
                self._attemptChildren[engine, reason] = self._attempts.labels(engine, reason).inc

    # -- hooks (the request path and the broker channel call these) --------------------

    def rpcMessage(self, name: str, errorCode: int | None = None) -> None:
        """One broker message handled; ``errorCode`` when it was answered with an error."""
        if errorCode == METHOD_NOT_FOUND:
            name = "unknown"  # never a label per unknown name: the label set stays bounded
        child = self._rpcChildren.get(name)
        if child is None:
            child = self._rpcChildren[name] = self._rpc.labels(name)
        child.inc()
        if errorCode is not None:
            self._rpcErrors.labels(name, str(errorCode)).inc()

    def hookFailed(self, hook: str) -> None:
        """A request observer raised in ``hook`` (one of ``hooks.HOOKS``)."""
        self._hookErrors.labels(hook).inc()

    def internalError(self) -> None:
        """An unexpected exception escaped while handling a request."""
        self._internalChild.inc()

    def proxyError(self, engineId: str, reason: str) -> None:
        """The proxy answered a request itself with the error ``reason``."""
        key = (engineId, reason)
        child = self._errorChildren.get(key)
        if child is None:
            child = self._errorChildren[key] = self._proxyErrors.labels(engineId, reason)
        child.inc()

    def hostDenied(self, listener: str) -> None:
        """A request on ``listener`` (an engine id or ``ops``) was refused for its ``Host``."""
        self._hostDenied.labels(listener).inc()

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        """An attempt ended uncommitted (``outcome.kind`` is the reason)."""
        key = (exchange.engine.id, outcome.kind)
        inc = self._attemptChildren.get(key)
        if inc is None:
            inc = self._attemptChildren[key] = self._attempts.labels(*key).inc
        inc(1)

    def committed(self, exchange: IExchangeReport, nodeId: str, ttftSeconds: float) -> None:
        """An attempt committed ``ttftSeconds`` after admission."""
        engineId = exchange.engine.id
        self._attemptChildren[engineId, "committed"](1)
        self._ttftChildren[engineId, exchange.inference](ttftSeconds)

    def requestEnded(self, exchange: IExchangeReport) -> None:
        """An exchange ended: count it by engine, route class and outcome."""
        key = (exchange.engine.id, exchange.inference, requestOutcome(exchange))
        inc = self._requestChildren.get(key)
        if inc is None:
            inc = self._requestChildren[key] = self._requests.labels(
                key[0], ROUTES[key[1]], key[2]
            ).inc
        inc(1)

    def fleetReload(self, result: ReloadResult) -> None:
        """One fleet file reload, labelled by its result's value (one of ``COUNTED``)."""
        self._fleetReloads.labels(result.value).inc()

    def streamStalled(self, engineId: str) -> None:
        """A committed stream was cut for engine silence."""
        self._stalled.labels(engineId).inc()

    def fleetMerge(self, engineId: str, answered: int, failed: int) -> None:
        """A fleet model list was merged from ``answered`` nodes (``failed`` did not answer)."""
        self._fleetMerges.labels(engineId).inc()
        if answered:
            self._fleetSources.labels(engineId, "answered").inc(answered)
        if failed:
            self._fleetSources.labels(engineId, "failed").inc(failed)
