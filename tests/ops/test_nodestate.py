"""Tests for nvpair.proxy.ops.nodestate: up, down or unknown, from inventory polls or attempts."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.dispatch.outcome import Failed
from nvpair.proxy.endings import FailureKind
from nvpair.proxy.facade.standalone import POLL_INTERVAL, FleetPoller
from nvpair.proxy.ops.nodestate import STALE_AFTER, NodeState, attemptHealth, pollHealth
from nvpair.proxy.ops.server import opsResource
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.fakecontext import ExchangeReport
from tests.facade.fleetkit import FakeResponse, FakeUpstream, openaiList
from tests.ops.opskit import ENGINE, makeService, memoryClient, scripted


class PollHealthTests(SynchronousTestCase):
    """Standalone: the inventory poll decides."""

    def test_states(self) -> None:
        """Answered: up with its model count; failed: down with the problem; none yet: unknown."""
        self.assertEqual(
            pollHealth((5.0, ""), 2), (NodeState.UP, "inventory poll answered: 2 models", 5.0)
        )
        self.assertEqual(
            pollHealth((5.0, ""), 1), (NodeState.UP, "inventory poll answered: 1 model", 5.0)
        )
        self.assertEqual(
            pollHealth((7.0, "status 500"), 0),
            (NodeState.DOWN, "inventory poll failed: status 500", 7.0),
        )
        self.assertEqual(pollHealth(None, 0), (NodeState.UNKNOWN, "inventory poll pending", None))
        self.assertEqual(
            pollHealth((7.0, "TimeoutError"), 0)[1], "inventory poll failed: no answer in time"
        )


class AttemptHealthTests(SynchronousTestCase):
    """Under a broker: this process's last attempt on the node decides."""

    def test_states(self) -> None:
        """Committed or answered a status: up; transport or timeouts: down; none: unknown."""
        self.assertEqual(
            attemptHealth((10.0, None, None), 12.0), (NodeState.UP, "last attempt served", 10.0)
        )
        self.assertEqual(
            attemptHealth((10.0, "status", 503), 12.0),
            (NodeState.UP, "last attempt answered status 503", 10.0),
        )
        for kind in ("transport", "header_timeout", "no_content"):
            state, reason, when = attemptHealth((10.0, kind, None), 12.0)
            self.assertEqual((state, when), (NodeState.DOWN, 10.0), kind)
            self.assertTrue(reason.startswith("last attempt "), reason)
        self.assertEqual(
            attemptHealth(None, 12.0),
            (NodeState.UNKNOWN, "listed by discovery, not tried yet", None),
        )

    def test_stale(self) -> None:
        """Evidence older than the 15-minute window no longer counts."""
        self.assertEqual(attemptHealth((0.0, "transport", None), STALE_AFTER)[0], NodeState.DOWN)
        state, reason, when = attemptHealth((0.0, "transport", None), STALE_AFTER + 1)
        self.assertEqual((state, when), (NodeState.UNKNOWN, 0.0))
        self.assertEqual(
            reason, "no attempt in the last 15 min (last attempt could not reach the engine)"
        )


class StatusStateTests(SynchronousTestCase):
    """``/status`` carries each node's state, the reason and when it was checked."""

    def nodes(self, service: Any) -> dict[str, dict[str, Any]]:
        """The nodes of the llamacpp facade in ``/status``, by id."""
        response = self.successResultOf(
            memoryClient(opsResource(service)).get("http://127.0.0.1/status")
        )
        doc = json.loads(self.successResultOf(response.content()))
        return {n["id"]: n for n in doc["facades"]["llamacpp"]["nodes"]}

    def test_underBroker(self) -> None:
        """Attempts reported to the service set the states of discovered nodes."""
        reactor = MemoryReactorClock()
        service = makeService(reactor)
        scripted(service)
        exchange = ExchangeReport(service.context, ENGINE, createdAt=reactor.seconds())
        node = Node("A", False, ("http://10.0.0.1:8081",), frozenset())
        service.context.attemptFailed(exchange, Failed(FailureKind.TRANSPORT, node))
        a, me = self.nodes(service)["A"], self.nodes(service)["me"]
        self.assertEqual(
            (a["state"], a["stateReason"], a["checkedAt"]),
            (
                NodeState.DOWN.value,
                "last attempt could not reach the engine",
                int(reactor.seconds() * 1000),
            ),
        )
        self.assertEqual((me["state"], me["checkedAt"]), (NodeState.UNKNOWN.value, None))
        reactor.advance(3)
        service.context.committed(exchange, "A")
        self.assertEqual(self.nodes(service)["A"]["state"], NodeState.UP.value)
        reactor.advance(STALE_AFTER + 1)
        self.assertEqual(self.nodes(service)["A"]["state"], NodeState.UNKNOWN.value)

    def test_standalone(self) -> None:
        """The poller's last result per backend: answered, refused, not yet answered."""
        reactor = MemoryReactorClock()
        service = makeService(reactor, "--standalone", "--engines", "llamacpp")
        facade = service.enableFacade(ENGINE, 18081, [], True)
        upstream = FakeUpstream()
        upstream.script["http://a:1"] = FakeResponse(200, openaiList("a", "m1", "m2"))
        upstream.script["http://b:1"] = ConnectionRefusedError()
        upstream.script["http://c:1"] = "hang"
        poller = FleetPoller(
            facade, ["http://a:1", "http://b:1", "http://c:1"], upstream, reactor, 30.0
        )
        poller.setServiceParent(service)
        poller.startService()
        self.addCleanup(poller.stopService)
        reactor.advance(POLL_INTERVAL)
        found = self.nodes(service)
        polled = int(reactor.seconds() * 1000)
        self.assertEqual(
            (
                found["http://a:1"]["state"],
                found["http://a:1"]["stateReason"],
                found["http://a:1"]["checkedAt"],
            ),
            (NodeState.UP.value, "inventory poll answered: 2 models", polled),
        )
        self.assertEqual(found["http://a:1"]["modelNames"], ["m1", "m2"])
        self.assertEqual(
            (found["http://b:1"]["state"], found["http://b:1"]["stateReason"]),
            (NodeState.DOWN.value, "inventory poll failed: could not connect"),
        )
        self.assertEqual(
            (found["http://c:1"]["state"], found["http://c:1"]["checkedAt"]),
            (NodeState.UNKNOWN.value, None),
        )
