"""The broker channel (protocol §2-§4): framing, addressing, error codes, survival of bad input."""

from __future__ import annotations

import json
import tempfile
from typing import Any

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.channel import (
    BrokerChannel,
    ChannelState,
    NullSink,
    OutputFlow,
    Reply,
    RPCError,
    SinkSwitch,
    isFacadeScoped,
    resolveAddress,
)
from nvpair.proxy.interfaces import IBrokerSink, IMessageHandler
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService
from nvpair.proxy.testing.wire import drainLines, sendLine


@implementer(IMessageHandler)
class FakeHandler:
    """Records calls; answers from a script keyed by name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}

    def handle(self, engine: str | None, name: str, params: dict[str, Any]) -> object:
        self.calls.append((engine, name, params))
        answer = self.answers.get(name, {"ok": True})
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer()
        return answer


class ChannelTests(SynchronousTestCase):
    """A ``BrokerChannel`` over a ``StringTransport`` with a fake handler."""

    def setUp(self) -> None:
        self.handler = FakeHandler()
        self.closed = 0
        self.channel = BrokerChannel(self.handler, self._closed)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def _closed(self) -> None:
        self.closed += 1

    def send(self, data: bytes | dict[str, Any]) -> None:
        sendLine(self.channel, data)

    def output(self) -> list[dict[str, Any]]:
        raw, messages = drainLines(self.transport)
        self.assertTrue(raw == b"" or raw.endswith(b"\n"))
        return messages

    def reports(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [m["params"] for m in messages if m.get("method") == "errors:report"]

    def assertOnlyProtocolReport(self) -> dict[str, Any]:
        out = self.output()
        self.assertEqual(len(out), 1, out)
        self.assertEqual(out[0]["method"], "errors:report")
        self.assertNotIn("id", out[0])
        params: dict[str, Any] = out[0]["params"]
        self.assertEqual(params["kind"], "protocol")
        return params

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

    def test_notJSON(self) -> None:
        """A line that is not JSON is dropped and reported; the channel goes on."""
        self.send(b"this is not json\n")
        self.assertOnlyProtocolReport()
        self.send(b"\xff\xfe{\n")
        self.assertOnlyProtocolReport()
        self.send({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {}})
        self.assertEqual(self.output()[0]["id"], 1)

    def test_notObject(self) -> None:
        """A JSON value that is not an object is dropped and reported."""
        for line in (b"[1,2]\n", b"42\n", b'"s"\n', b"null\n"):
            self.send(line)
            self.assertOnlyProtocolReport()
        self.assertEqual(self.handler.calls, [])

    def test_blankLinesIgnored(self) -> None:
        """Empty lines are neither handled nor reported."""
        self.send(b"\n  \n")
        self.assertEqual(self.output(), [])

    def test_responseFromBroker(self) -> None:
        """A response object from the broker is reported, never handled or answered."""
        self.send({"jsonrpc": "2.0", "id": 5, "result": {}})
        self.send({"jsonrpc": "2.0", "id": 6, "error": {"code": 1, "message": "x"}})
        self.assertEqual(len(self.reports(self.output())), 2)
        self.assertEqual(self.handler.calls, [])

    def test_noMethod(self) -> None:
        """A request without a method is answered -32600 and reported."""
        self.send({"jsonrpc": "2.0", "id": 5})
        out = self.output()
        self.assertEqual(self.reports(out)[0]["kind"], "protocol")
        answers = [m for m in out if "id" in m]
        self.assertEqual(answers[0]["error"]["code"], jsonrpc.INVALID_REQUEST)

    def test_badId(self) -> None:
        """A request whose id is not a string, number or null is dropped and reported."""
        self.send({"jsonrpc": "2.0", "id": {"a": 1}, "method": "x", "params": {}})
        self.assertOnlyProtocolReport()
        self.assertEqual(self.handler.calls, [])

    def test_overlongLine(self) -> None:
        """A line over 1 MiB is dropped whole and reported once; the next line is handled."""
        big = b"x" * (jsonrpc.MAX_LINE + 10)
        for i in range(0, len(big), 65536):
            self.send(big[i : i + 65536])
        self.send(b'garbage-tail"}\n')
        self.assertOnlyProtocolReport()
        self.send({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {}})
        self.assertEqual(self.output(), [{"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}])

    def test_overlongLineInOneChunk(self) -> None:
        """An over-long line arriving with its newline in one write is dropped and reported."""
        self.send(
            b"{"
            + b" " * (jsonrpc.MAX_LINE + 1)
            + b"}\n"
            + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "x"}).encode()
            + b"\n"
        )
        out = self.output()
        self.assertEqual(self.reports(out)[0]["kind"], "protocol")
        self.assertEqual(out[-1]["id"], 2)

    def test_lineAtLimit(self) -> None:
        """A line of exactly 1 MiB is accepted."""
        message = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"p": ""}})
        pad = jsonrpc.MAX_LINE - len(message)
        line = message[:-2] + " " * pad + "}}"
        self.assertEqual(len(line), jsonrpc.MAX_LINE)
        self.send(line.encode() + b"\n")
        self.assertEqual(self.output()[0]["result"], {"ok": True})

    def test_splitAcrossWrites(self) -> None:
        """A message split across several writes is handled once complete."""
        data = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x"}).encode() + b"\n"
        for byte in data:
            self.send(bytes([byte]))
        self.assertEqual(len(self.output()), 1)

    def test_notifyAfterClose(self) -> None:
        """Stdin EOF calls ``onClosed`` once; after connection loss nothing more is written."""
        self.assertIs(self.channel.state, ChannelState.OPEN)
        self.channel.readConnectionLost()
        self.channel.readConnectionLost()
        self.assertEqual(self.closed, 1)
        self.assertIs(self.channel.state, ChannelState.ENDED)
        self.channel.connectionLost(None)
        self.assertIs(self.channel.state, ChannelState.CLOSED)
        self.assertEqual(self.closed, 1)
        self.channel.notify("ollama:ready", {})
        self.assertEqual(self.transport.value(), b"")

    def test_lostWithoutEOF(self) -> None:
        """A connection lost without an EOF first still tells the process, once."""
        self.channel.connectionLost(None)
        self.channel.writeConnectionLost()
        self.assertEqual(self.closed, 1)
        self.assertIs(self.channel.state, ChannelState.CLOSED)

    def test_sinkSwitch(self) -> None:
        """The switch forwards to its current target and says whether anyone listens."""
        switch = SinkSwitch(NullSink())
        self.assertTrue(verifyObject(IBrokerSink, switch))
        self.assertFalse(switch.listening)
        switch.notify("ollama:ready", {})
        switch.target = self.channel
        self.assertTrue(switch.listening)
        switch.notify("ollama:ready", {"port": 1})
        self.assertEqual(self.output()[0]["params"], {"port": 1})


class BacklogTests(SynchronousTestCase):
    """A broker that stops reading stdout: notifications bounded, dropped ones reported."""

    def setUp(self) -> None:
        self.channel = BrokerChannel(FakeHandler(), lambda: None, backlogLimit=1000)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def lines(self) -> list[dict[str, Any]]:
        return drainLines(self.transport)[1]

    def stdout(self) -> Any:
        """The producer the channel registered (what the stdout transport pauses)."""
        return self.transport.producer

    def test_registeredAsStreamingProducer(self) -> None:
        """The channel learns from stdout's own buffer when the broker stops reading."""
        self.assertIsNotNone(self.transport.producer)
        self.assertTrue(self.transport.streaming)

    def test_flowingNothingDropped(self) -> None:
        """While the broker reads, every notification is written, however many."""
        for i in range(200):
            self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        self.assertEqual(len(self.lines()), 200)

    def test_stalledBoundedThenReported(self) -> None:
        """Once stdout stalls, notifications fill the backlog allowance and the rest are
        dropped; when the broker has read everything, one overflow report says how many."""
        self.assertIs(self.channel.flow, OutputFlow.FLOWING)
        self.stdout().pauseProducing()
        self.assertIs(self.channel.flow, OutputFlow.STALLED)
        for i in range(100):
            self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        raw, written = drainLines(self.transport)
        self.assertLessEqual(len(raw), 1000)
        kept = len(written)
        self.assertGreater(kept, 0)
        self.assertEqual([m["params"]["inFlight"] for m in written], list(range(kept)))
        self.stdout().resumeProducing()
        out = self.lines()
        self.assertEqual(
            out,
            [
                {
                    "jsonrpc": "2.0",
                    "method": "errors:report",
                    "params": {
                        "kind": "overflow",
                        "message": f"{100 - kept} notifications dropped while stdout was not read",
                    },
                }
            ],
        )
        self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": 0})
        self.assertEqual(len(self.lines()), 1, "flowing again")
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_responsesNeverDropped(self) -> None:
        """Answers to broker requests are written even past the backlog allowance."""
        self.stdout().pauseProducing()
        for i in range(100):
            self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": i})
        self.lines()
        sendLine(self.channel, {"jsonrpc": "2.0", "id": 7, "method": "ping"})
        self.assertEqual(self.lines(), [{"jsonrpc": "2.0", "id": 7, "result": {"ok": True}}])

    def test_resumeWithoutDropsReportsNothing(self) -> None:
        """A short stall that stayed within the allowance leaves no report."""
        self.stdout().pauseProducing()
        self.channel.notify("discovery:node-activity", {"nodeId": "A", "inFlight": 1})
        self.stdout().resumeProducing()
        self.assertEqual([m["method"] for m in self.lines()], ["discovery:node-activity"])


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
