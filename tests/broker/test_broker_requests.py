"""The broker channel (protocol §2-§4): requests and notifications, addressing, error
codes and deferred answers, with a fake handler and in front of the real service."""

from __future__ import annotations

import json
import tempfile
from typing import Any

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.channel import BrokerChannel, Reply, RPCError, isFacadeScoped
from nvpair.proxy.broker.jsonrpc import resolveAddress
from nvpair.proxy.interfaces import IBrokerSink, IMessageHandler
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService
from nvpair.proxy.testing.wire import drainLines, sendLine
from tests.broker.channelkit import ChannelCase


class ChannelTests(ChannelCase):
    """Requests, notifications, addressing and error answers."""

    def test_interfaces(self) -> None:
        """The channel is a broker sink and the fake a message handler."""
        verifyObject(IBrokerSink, self.channel)
        verifyObject(IMessageHandler, self.handler)

    def test_requestAnswered(self) -> None:
        """A request gets exactly one response with its id; the handler sees the params."""
        self.send(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "facade/enable",
                "params": {"engine": "ollama", "port": 1},
            }
        )
        self.assertEqual(self.output(), [{"jsonrpc": "2.0", "id": 7, "result": {"ok": True}}])
        self.assertEqual(
            self.handler.calls, [(None, "facade/enable", {"engine": "ollama", "port": 1})]
        )

    def test_stringIdAndMissingParams(self) -> None:
        """String ids are echoed; absent or null params become an empty object."""
        self.send({"jsonrpc": "2.0", "id": "a", "method": "log/set-level"})
        self.send({"jsonrpc": "2.0", "id": "b", "method": "log/set-level", "params": None})
        self.assertEqual([m["id"] for m in self.output()], ["a", "b"])
        self.assertEqual([c[2] for c in self.handler.calls], [{}, {}])

    def test_notificationNotAnswered(self) -> None:
        """A notification gets no response."""
        self.send({"jsonrpc": "2.0", "method": "ollama:discovery:nodes", "params": {"nodes": []}})
        self.assertEqual(self.output(), [])
        self.assertEqual(self.handler.calls, [("ollama", "discovery:nodes", {"nodes": []})])

    def test_noneResultIsEmptyObject(self) -> None:
        """A handler returning None answers a request with ``{}``."""
        self.handler.answers["node/select"] = lambda: None
        self.send(
            {"jsonrpc": "2.0", "id": 1, "method": "ollama:node/select", "params": {"nodeId": None}}
        )
        self.assertEqual(self.output()[0]["result"], {})

    def test_addressing(self) -> None:
        """Only a known engine id before the first colon is an address."""
        self.assertEqual(resolveAddress("ollama:ready"), ("ollama", "ready"))
        self.assertEqual(
            resolveAddress("llamacpp:discovery:nodes"), ("llamacpp", "discovery:nodes")
        )
        self.assertEqual(resolveAddress("lmstudio:set-port"), ("lmstudio", "set-port"))
        self.assertEqual(resolveAddress("ollama:errors:report"), ("ollama", "errors:report"))
        self.assertEqual(resolveAddress("errors:report"), (None, "errors:report"))
        self.assertEqual(resolveAddress("workload:submitted"), (None, "workload:submitted"))
        self.assertEqual(
            resolveAddress("discovery:node-activity"), (None, "discovery:node-activity")
        )
        self.assertEqual(resolveAddress("vllm:ready"), (None, "vllm:ready"))
        self.assertEqual(resolveAddress("facade/enable"), (None, "facade/enable"))

    def test_unaddressedProcessMethodsReachHandler(self) -> None:
        """Process-scoped methods, even those sharing a prefix with facade ones, are not refused."""
        for method in (
            "node/set-priority",
            "log/set-level",
            "facade/enable",
            "errors:report",
            "workload:submitted",
        ):
            self.assertFalse(isFacadeScoped(method), method)
            self.send({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}})
            out = self.output()
            self.assertEqual(out[0].get("result"), {"ok": True}, method)
        self.assertEqual([c[0] for c in self.handler.calls], [None] * 5)
        self.assertEqual(
            [c[1] for c in self.handler.calls],
            [
                "node/set-priority",
                "log/set-level",
                "facade/enable",
                "errors:report",
                "workload:submitted",
            ],
        )

    def test_unaddressedFacadeName(self) -> None:
        """A facade-scoped name without an address is -32602 ``no facade addressed``."""
        for name in (
            "ready",
            "set-port",
            "discovery:nodes",
            "discovery:subscribe",
            "node/select",
            "node/set-local-backend",
            "error",
        ):
            self.send({"jsonrpc": "2.0", "id": 3, "method": name, "params": {}})
            out = self.output()
            self.assertEqual(
                out,
                [
                    {
                        "jsonrpc": "2.0",
                        "id": 3,
                        "error": {"code": -32602, "message": "no facade addressed"},
                    }
                ],
                name,
            )
        self.assertEqual(self.handler.calls, [])

    def test_unaddressedFacadeNotification(self) -> None:
        """As a notification the same mistake is only an ``errors:report``."""
        self.send({"jsonrpc": "2.0", "method": "discovery:nodes", "params": {"nodes": []}})
        report = self.assertOnlyProtocolReport()
        self.assertIn("no facade addressed", report["message"])

    def test_handlerErrors(self) -> None:
        """An ``RPCError`` becomes the error response with code, message and data."""
        self.handler.answers["set-port"] = RPCError(
            jsonrpc.BIND_FAILED, "cannot listen", {"engine": "ollama", "port": 5, "reason": "x"}
        )
        self.handler.answers["facade/enable"] = RPCError(jsonrpc.INVALID_PARAMS, "unknown engine")
        self.handler.answers["ready"] = RPCError(jsonrpc.FACADE_NOT_ENABLED, "facade not enabled")
        self.handler.answers["nope"] = RPCError(jsonrpc.METHOD_NOT_FOUND, "method not found")
        self.send({"jsonrpc": "2.0", "id": 1, "method": "ollama:set-port", "params": {}})
        self.send({"jsonrpc": "2.0", "id": 2, "method": "facade/enable", "params": {}})
        self.send({"jsonrpc": "2.0", "id": 3, "method": "lmstudio:ready", "params": {}})
        self.send({"jsonrpc": "2.0", "id": 4, "method": "nope", "params": {}})
        errors = [m["error"] for m in self.output()]
        self.assertEqual(
            errors,
            [
                {
                    "code": -32010,
                    "message": "cannot listen",
                    "data": {"engine": "ollama", "port": 5, "reason": "x"},
                },
                {"code": -32602, "message": "unknown engine"},
                {"code": -32004, "message": "facade not enabled"},
                {"code": -32601, "message": "method not found"},
            ],
        )

    def test_notificationErrorsOnlyReported(self) -> None:
        """Unknown methods and bad params as notifications produce only ``errors:report``."""
        self.handler.answers["nope"] = RPCError(jsonrpc.METHOD_NOT_FOUND, "method not found")
        self.send({"jsonrpc": "2.0", "method": "nope", "params": {}})
        self.assertIn("method not found", self.assertOnlyProtocolReport()["message"])
        self.send({"jsonrpc": "2.0", "method": "ollama:discovery:nodes", "params": [1, 2]})
        self.assertIn("params", self.assertOnlyProtocolReport()["message"])

    def test_paramsNotObject(self) -> None:
        """Params that are not an object are -32602 without reaching the handler."""
        self.send({"jsonrpc": "2.0", "id": 9, "method": "log/set-level", "params": ["debug"]})
        self.assertEqual(self.output()[0]["error"]["code"], -32602)
        self.assertEqual(self.handler.calls, [])

    def test_handlerCrash(self) -> None:
        """An unexpected exception in the handler answers an error and the channel goes on."""
        self.handler.answers["boom"] = KeyError("secret")
        self.send({"jsonrpc": "2.0", "id": 1, "method": "boom", "params": {}})
        out = self.output()
        self.assertEqual(out[0]["error"]["code"], jsonrpc.INTERNAL_ERROR)
        self.assertNotIn("secret", json.dumps(out))
        self.flushLoggedErrors(KeyError)
        self.send({"jsonrpc": "2.0", "id": 2, "method": "ok", "params": {}})
        self.assertEqual(self.output()[0]["result"], {"ok": True})

    def test_deferredResultAndReply(self) -> None:
        """A Deferred answer is sent when it fires; ``Reply.after`` runs after the response."""
        d: defer.Deferred[object] = defer.Deferred()
        self.handler.answers["slow"] = lambda: d
        self.send({"jsonrpc": "2.0", "id": 1, "method": "slow", "params": {}})
        self.assertEqual(self.output(), [])
        d.callback(Reply({"port": 1}, lambda: self.channel.notify("ollama:ready", {"port": 1})))
        out = self.output()
        self.assertEqual(out[0], {"jsonrpc": "2.0", "id": 1, "result": {"port": 1}})
        self.assertEqual(
            out[1], {"jsonrpc": "2.0", "method": "ollama:ready", "params": {"port": 1}}
        )

    def test_deferredRPCError(self) -> None:
        """A Deferred failing with ``RPCError`` answers that error."""
        self.handler.answers["slow"] = lambda: defer.fail(RPCError(-32602, "bad"))
        self.send({"jsonrpc": "2.0", "id": 1, "method": "slow", "params": {}})
        self.assertEqual(self.output()[0]["error"], {"code": -32602, "message": "bad"})


class UnknownNameTests(SynchronousTestCase):
    """The channel in front of the real service: only exact names are known (spec §4)."""

    def setUp(self) -> None:
        options = Options({})
        options.parseOptions(["--state-dir", tempfile.mkdtemp(prefix="nvpair-broker-")])
        assert options.settings is not None
        self.service = ProxyService(options.settings, MemoryReactorClock())
        self.channel = BrokerChannel(self.service.handlers, lambda: None)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def answer(self, method: str) -> dict[str, Any]:
        """The one response to a request for ``method`` with empty params."""
        sendLine(self.channel, {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}})
        _, messages = drainLines(self.transport)
        self.assertEqual(len(messages), 1, messages)
        return messages[0]

    def test_nearMissesAreNotFound(self) -> None:
        """Names that only look like known ones (a trailing slash, a prefix, another case,
        an unknown facade-scoped suffix) are -32601, addressed or not."""
        for method in (
            "node/set-priority/",
            "node/",
            "node/nope",
            "errors:",
            "errors:nope",
            "ready/",
            "Ready",
            "set-port ",
            "discovery:nodes/",
            "node/select/x",
            "llamacpp:node/set-priority/",
            "llamacpp:node/nope",
            "ollama:ready/",
        ):
            self.assertEqual(
                self.answer(method)["error"],
                {"code": -32601, "message": "method not found"},
                method,
            )

    def test_exactNamesStillRouted(self) -> None:
        """The exact names keep their answers: a facade-scoped one unaddressed is -32602,
        a process one reaches its handler."""
        self.assertEqual(
            self.answer("node/select")["error"], {"code": -32602, "message": "no facade addressed"}
        )
        self.assertEqual(self.answer("node/set-priority")["error"]["code"], -32602)
        self.assertNotEqual(
            self.answer("node/set-priority")["error"]["message"], "no facade addressed"
        )
