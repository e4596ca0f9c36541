"""Shared by the ops listener tests (``test_ops_status``, ``test_ops_scrape``,
``test_ops_listener``) and the node-state and ops page tests: a real, unstarted
``ProxyService`` with scripted state, an in-memory client of its ops resource, and a
Prometheus exposition parser."""

from __future__ import annotations

import tempfile
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from treq import content
from treq.client import HTTPClient
from treq.testing import RequestTraversalAgent
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IResponse
from twisted.web.resource import IResource

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.ops.server import opsResource
from nvpair.proxy.options import Options
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.nodes import parseNodes
from nvpair.proxy.routing.reservations import NodeLoad
from nvpair.proxy.service import ProxyService

ENGINE = ENGINES["llamacpp"]
START = 1_700_000_000.0


def memoryClient(resource: IResource) -> HTTPClient:
    """An in-memory HTTP client of ``resource`` (what ``treq.testing.StubTreq`` builds, typed;
    enough for requests without a body)."""
    return HTTPClient(RequestTraversalAgent(resource))


def makeService(reactor: Any, *argv: str) -> ProxyService:
    """A real, unstarted ``ProxyService`` on ``reactor`` with a throwaway state directory."""
    options = Options(environ={})
    options.parseOptions(["--state-dir", tempfile.mkdtemp(prefix="nvpair-ops-"), *argv])
    assert options.settings is not None
    return ProxyService(options.settings, reactor)


def scripted(service: ProxyService) -> None:
    """Give ``service`` a facade, discovery, scheduler view, activity and two ended workloads."""
    facade = service.enableFacade(ENGINE, 18081, ["127.0.0.1:18082"], True)
    nodes = parseNodes(
        {
            "nodes": [
                {
                    "id": "A",
                    "addresses": ["http://10.0.0.1:8081", "http://10.0.0.2:8081"],
                    "models": ["m1", "m2"],
                },
                {"id": "me", "self": True, "models": ["m1"]},
            ]
        }
    )
    facade.setSnapshot(Snapshot(nodes, ENGINE.normalize))
    facade.confirmed["A"] = "http://10.0.0.2:8081"
    facade.pin = "A"
    facade.setLocalBackend("http://127.0.0.1:8080")
    service.context.reservations.applyPriority(7, ["A", "me"], {"A": NodeLoad(2, 0.5)})
    service.context.reservations.reserve("A")
    service.context.activity.change("A", +1)
    reporter = service.context.reporter
    reactor = service.reactor
    assert isinstance(reactor, MemoryReactorClock)
    reactor.advance(START - reactor.seconds())
    done = reporter.admit("llamacpp", "m1")
    done.submitted("A")
    done.started("A")
    done.finish("completed", None, {"completionTokens": 3})
    failed = reporter.admit("llamacpp", "m2")
    reactor.advance(2.5)
    failed.finish("failed", "no_owner")
    reporter.admit("llamacpp", "m1")  # still live


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Parse a Prometheus text exposition into {(sample name, label items): value}."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


class EndpointTestCase(SynchronousTestCase):
    """A scripted service and an in-memory client of its ops resource."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.service = makeService(self.reactor)
        scripted(self.service)
        self.client = memoryClient(opsResource(self.service))

    def get(self, url: str, method: str = "GET") -> tuple[IResponse, bytes]:
        """Request ``url`` in memory; returns the response and its body."""
        response = self.successResultOf(self.client.request(method, url))
        body = self.successResultOf(content(response))
        return response, body
