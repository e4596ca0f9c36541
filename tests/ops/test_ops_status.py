"""The ops listener's ``GET /status`` (spec §13), in memory: facades, discovery, the
scheduler view and recent workloads of a scripted service."""

from __future__ import annotations

import json

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.ops.interfaces import IOpsContext, IOpsView
from nvpair.proxy.ops.server import opsResource
from tests.ops.opskit import EndpointTestCase, makeService, memoryClient

SECRET_PROMPT = "CANARY-ops-prompt"


class ViewTests(SynchronousTestCase):
    """The process provides everything the operations listener reads of it."""

    def test_serviceProvidesOpsView(self) -> None:
        """``ProxyService`` provides ``IOpsView`` (attributes and service collection)."""
        service = makeService(MemoryReactorClock())
        self.assertTrue(verifyObject(IOpsView, service))
        self.assertTrue(verifyObject(IOpsContext, service.context))


class StatusTests(EndpointTestCase):
    """GET /status."""

    def test_facade(self) -> None:
        """Each facade shows its ports, pin, local backend and the scheduler generation."""
        response, body = self.get("http://127.0.0.1:9464/status")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        facade = json.loads(body)["facades"]["llamacpp"]
        self.assertEqual(facade["port"], 18081)
        self.assertEqual(facade["aliases"], ["127.0.0.1:18082"])
        self.assertEqual(facade["pin"], "A")
        self.assertEqual(facade["localBackend"], "http://127.0.0.1:8080")
        self.assertEqual(facade["schedulerGeneration"], 7)
        self.assertEqual(facade["discoveryUpdates"], 1)

    def test_discovery(self) -> None:
        """Nodes show model counts, addresses, the confirmed address, activity and load."""
        _, body = self.get("http://127.0.0.1/status")
        nodes = {n["id"]: n for n in json.loads(body)["facades"]["llamacpp"]["nodes"]}
        self.assertEqual(set(nodes), {"A", "me"})
        a = nodes["A"]
        self.assertEqual(a["models"], 2)
        self.assertFalse(a["self"])
        self.assertEqual(a["addresses"], ["http://10.0.0.1:8081", "http://10.0.0.2:8081"])
        self.assertEqual(a["confirmed"], "http://10.0.0.2:8081")
        self.assertEqual((a["inFlight"], a["reserved"]), (1, 1))
        self.assertEqual(a["estimatedLoad"], 3.5)
        me = nodes["me"]
        self.assertTrue(me["self"])
        self.assertEqual((me["models"], me["confirmed"], me["estimatedLoad"]), (1, None, 0.0))

    def test_scheduler(self) -> None:
        """The process-wide scheduler view: generation, order and estimated load per node."""
        _, body = self.get("http://127.0.0.1/status")
        doc = json.loads(body)
        self.assertEqual(
            doc["scheduler"],
            {"generation": 7, "order": ["A", "me"], "estimatedLoad": {"A": 3.5, "me": 0.0}},
        )
        self.assertEqual(doc["inFlight"], {"A": 1})
        self.assertEqual(doc["reservations"], {"A": 1})
        self.assertEqual(doc["runId"], self.service.context.reporter.runId)

    def test_workloads(self) -> None:
        """The last workloads, newest first, with ids, model, state, node, attempts and stats."""
        _, body = self.get("http://127.0.0.1/status")
        workloads = json.loads(body)["workloads"]
        self.assertEqual(workloads["live"], 1)
        self.assertEqual(workloads["terminals"], {"completed": 1, "failed": 1})
        first, second = workloads["recent"]
        self.assertEqual(
            first,
            {
                "id": "2",
                "engine": "llamacpp",
                "model": "m2",
                "state": "failed",
                "node": None,
                "attempts": 0,
                "error": "no_owner",
                "stats": None,
                "createdAt": 1_700_000_000_000,
                "completedAt": 1_700_000_002_500,
                "durationMs": 2500,
                "errorText": "no node serves this model",
            },
        )
        self.assertEqual(second["id"], "1")
        self.assertEqual(
            (second["state"], second["node"], second["attempts"]), ("completed", "A", 1)
        )
        self.assertEqual(second["stats"], {"completionTokens": 3})

    def test_recentIsBounded(self) -> None:
        """Only the last 50 workloads are listed."""
        for _ in range(60):
            self.service.context.reporter.admit("llamacpp", "m1").finish("completed")
        _, body = self.get("http://127.0.0.1/status")
        recent = json.loads(body)["workloads"]["recent"]
        self.assertEqual(len(recent), 50)
        self.assertEqual(recent[0]["id"], "63")

    def test_onlyListedFields(self) -> None:
        """A workload entry carries only its listed fields, whatever the history holds."""
        self.service.context.reporter.recent.append({"id": "x", "prompt": SECRET_PROMPT})
        _, body = self.get("http://127.0.0.1/status")
        self.assertNotIn(SECRET_PROMPT.encode(), body)

    def test_noFacades(self) -> None:
        """A service with nothing enabled answers an empty but well-formed document."""
        client = memoryClient(opsResource(makeService(MemoryReactorClock())))
        response = self.successResultOf(client.get("http://127.0.0.1/status"))
        doc = self.successResultOf(response.json())
        self.assertEqual(doc["facades"], {})
        self.assertEqual(doc["scheduler"], {"generation": None, "order": [], "estimatedLoad": {}})
        self.assertEqual(doc["workloads"]["recent"], [])
