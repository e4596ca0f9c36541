"""Tests for nvpair.supervisor.process: spawning and the start handshake, requests and
protocol errors (the fakes are in ``tests.support.fakeprocess``)."""

from __future__ import annotations

import os
import sys

from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IProcessTransport, IReactorProcess
from zope.interface.verify import verifyObject

from nvpair.proxy.broker import jsonrpc
from nvpair.supervisor.channel import ProxyChannel
from nvpair.supervisor.process import (
    ChannelState,
    ExitInfo,
    JSONRPCError,
    Lifecycle,
    ProcessGone,
    ProtocolError,
    ProxyProcess,
    RequestTimeout,
)
from tests.support.fakeprocess import Harness


class StartTests(Harness):
    """Spawning and the start handshake."""

    def test_command(self) -> None:
        """The proxy runs as twistd beside sys.executable, on the proxy's reactor, with the
        environment passed on."""
        proxy = self.make(path="/work/dir")
        proxy.start()
        spawn = self.reactor.spawned[0]
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        self.assertEqual(spawn.executable, twistd)
        self.assertEqual(
            spawn.args,
            [twistd, "--reactor=nvpair", "-n", "--pidfile=", "nvpair-proxy", "--state-dir", "/s"],
        )
        self.assertEqual(spawn.env, dict(os.environ))
        self.assertEqual(spawn.path, "/work/dir")

    def test_explicitExecutableAndEnv(self) -> None:
        """An explicit executable and environment are used as given."""
        proxy = ProxyProcess(self.reactor, [], {"A": "1"}, executable="/bin/twistd")
        proxy.start()
        spawn = self.reactor.spawned[0]
        self.assertEqual((spawn.executable, spawn.args[0]), ("/bin/twistd", "/bin/twistd"))
        self.assertEqual(spawn.env, {"A": "1"})

    def test_fakeTransportProvidesInterface(self) -> None:
        """The fake transport (and reactor) the tests drive really provide their interfaces."""
        self.make().start()
        self.assertTrue(verifyObject(IProcessTransport, self.reactor.transport))
        self.assertTrue(verifyObject(IReactorProcess, self.reactor))

    def test_lifecycle(self) -> None:
        """Idle, starting until the handshake, supervising, idle again once stopped; the
        channel is starting, ready, then closing and ended."""
        proxy = self.make()
        self.assertIs(proxy.lifecycle, Lifecycle.IDLE)
        proxy.start()
        self.assertIs(proxy.lifecycle, Lifecycle.STARTING)
        channel = self.reactor.spawned[0].protocol
        assert isinstance(channel, ProxyChannel)
        self.assertIs(channel.state, ChannelState.STARTING)
        self.reactor.transport.answer({})
        self.assertIs(proxy.lifecycle, Lifecycle.SUPERVISING)
        self.assertIs(channel.state, ChannelState.READY)
        proxy.stop()
        self.assertIs(proxy.lifecycle, Lifecycle.IDLE)
        self.assertIs(channel.state, ChannelState.CLOSING)
        self.reactor.transport.end()
        self.assertIs(channel.state, ChannelState.ENDED)

    def test_startAfterHandshake(self) -> None:
        """start() fires only after the log/set-level round trip, then pid is known."""
        proxy = self.make()
        d = proxy.start()
        self.assertNoResult(d)
        self.assertEqual(
            self.reactor.transport.messages(),
            [jsonrpc.request(1, "log/set-level", {"level": "info"})],
        )
        self.reactor.transport.answer({})
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(proxy.pid, 1000)
        self.successResultOf(proxy.whenRunning())

    def test_errorAnswerCompletesHandshake(self) -> None:
        """An error response to the handshake still proves the channel works."""
        d = self.make().start()
        self.reactor.transport.send(jsonrpc.error(1, -32602, "bad level"))
        self.successResultOf(d)

    def test_startTwice(self) -> None:
        """A second start() while active fails without spawning again."""
        proxy = self.make()
        proxy.start()
        self.failureResultOf(proxy.start(), RuntimeError)
        self.assertEqual(len(self.reactor.spawned), 1)

    def test_exitDuringStart(self) -> None:
        """A first process exiting before its handshake fails start(), with no restart."""
        proxy = self.make(restartPolicy=lambda attempt: 1.0)
        d = proxy.start()
        running = proxy.whenRunning()
        self.reactor.transport.end(2)
        failure = self.failureResultOf(d, ProcessGone)
        self.assertEqual(failure.value.exitInfo, ExitInfo(2, None))
        self.failureResultOf(running, ProcessGone)
        self.reactor.advance(100)
        self.assertEqual(len(self.reactor.spawned), 1)
        self.assertEqual(self.crashes, [])
        self.assertIsNone(proxy.pid)

    def test_handshakeTimeoutKills(self) -> None:
        """A silent first process is killed and start() fails with RequestTimeout."""
        proxy = self.make(requestTimeout=3.0)
        d = proxy.start()
        self.reactor.advance(3)
        transport = self.reactor.transport
        self.assertEqual(transport.signals, ["KILL"])
        self.assertNoResult(d)
        transport.end(None, 9)
        failure = self.failureResultOf(d, RequestTimeout)
        self.assertEqual((failure.value.method, failure.value.timeout), ("log/set-level", 3.0))
        self.assertEqual(proxy.pendingRequests, 0)
        self.assertEqual(self.reactor.getDelayedCalls(), [])


class RequestTests(Harness):
    """Requests, responses, ids and timeouts."""

    def test_framingAcrossChunks(self) -> None:
        """Responses split at any byte boundary, or several in one chunk, are all matched."""
        proxy, transport = self.started()
        d1 = proxy.request("a", {})
        d2 = proxy.request("b", {})
        d3 = proxy.request("c", {})
        data = jsonrpc.encode(jsonrpc.result(3, "two")) + jsonrpc.encode(jsonrpc.result(4, [3]))
        for i in range(len(data)):
            transport.stdout(data[i : i + 1])
        self.assertNoResult(d1)
        first = jsonrpc.encode(jsonrpc.result(2, {"n": 1}))
        transport.stdout(first[:5])
        transport.stdout(first[5:])
        self.assertEqual(self.successResultOf(d1), {"n": 1})
        self.assertEqual(self.successResultOf(d2), "two")
        self.assertEqual(self.successResultOf(d3), [3])
        self.assertEqual(self.errors, [])

    def test_idsIncreaseAndOutOfOrder(self) -> None:
        """Ids are increasing integers and out-of-order answers reach their own request."""
        proxy, transport = self.started()
        ds = [proxy.request("m", {"i": i}) for i in range(3)]
        self.assertEqual([m["id"] for m in transport.messages()], [1, 2, 3, 4])
        self.assertEqual(transport.messages()[1], jsonrpc.request(2, "m", {"i": 0}))
        for id in (4, 2, 3):
            transport.answer(id * 10, id=id)
        self.assertEqual([self.successResultOf(d) for d in ds], [20, 30, 40])
        self.assertEqual(proxy.pendingRequests, 0)

    def test_jsonrpcError(self) -> None:
        """An error response fails the request with JSONRPCError(code, message, data)."""
        proxy, transport = self.started()
        d1 = proxy.request("facade/enable", {"engine": "ollama", "port": 1})
        d2 = proxy.request("x:y", {})
        data = {"engine": "ollama", "port": 1, "reason": "in use"}
        transport.send(jsonrpc.error(2, -32010, "bind failed", data))
        transport.send(jsonrpc.error(3, -32601, "method not found"))
        e1 = self.failureResultOf(d1, JSONRPCError).value
        self.assertEqual((e1.code, e1.message, e1.data), (-32010, "bind failed", data))
        e2 = self.failureResultOf(d2, JSONRPCError).value
        self.assertEqual((e2.code, e2.message, e2.data), (-32601, "method not found", None))

    def test_timeout(self) -> None:
        """A timed-out request fails, leaves nothing pending and its late answer is ignored."""
        proxy, transport = self.started(requestTimeout=10.0)
        d = proxy.request("slow", {}, timeout=2.0)
        other = proxy.request("default", {})
        self.reactor.advance(1.5)
        self.assertNoResult(d)
        self.reactor.advance(0.5)
        failure = self.failureResultOf(d, RequestTimeout)
        self.assertEqual((failure.value.method, failure.value.id), ("slow", 2))
        self.assertEqual(proxy.pendingRequests, 1)
        transport.answer("late", id=2)
        self.assertEqual((self.errors, proxy.lateResponses), ([], 1))
        transport.answer("again", id=2)
        self.assertEqual(self.errors, ["duplicate response to id 2"])
        self.reactor.advance(8)
        self.failureResultOf(other, RequestTimeout)
        self.assertEqual(proxy.pendingRequests, 0)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_cancel(self) -> None:
        """Cancelling a request forgets it; its answer is then ignored as late."""
        proxy, transport = self.started()
        d = proxy.request("m", {})
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(proxy.pendingRequests, 0)
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        transport.answer(1, id=2)
        self.assertEqual((self.errors, proxy.lateResponses), ([], 1))

    def test_notify(self) -> None:
        """notify() writes a notification line without an id."""
        proxy, transport = self.started()
        proxy.notify("ollama:node/select", {"nodeId": None})
        expected = jsonrpc.notification("ollama:node/select", {"nodeId": None})
        self.assertEqual(transport.last(), expected)

    def test_unserializableParams(self) -> None:
        """Params that cannot be encoded fail the request without writing or using an id."""
        proxy, transport = self.started()
        self.failureResultOf(proxy.request("m", {"x": object()}), TypeError)
        proxy.request("n", {})
        self.assertEqual(transport.messages()[-1]["id"], 2)

    def test_pendingFailOnExit(self) -> None:
        """Pending requests fail with ProcessGone when the process ends; later ones too."""
        proxy, transport = self.started()
        d = proxy.request("m", {})
        transport.end(1)
        self.assertEqual(self.failureResultOf(d, ProcessGone).value.exitInfo, ExitInfo(1, None))
        self.failureResultOf(proxy.request("m", {}), ProcessGone)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_requestBeforeStart(self) -> None:
        """A request with no process fails with ProcessGone."""
        self.failureResultOf(self.make().request("m", {}), ProcessGone)


class ProtocolErrorTests(Harness):
    """Every kind of bad stdout input is reported and counted."""

    def assertReported(self, data: bytes, fragment: str) -> None:
        proxy, transport = self.started()
        transport.stdout(data)
        self.assertEqual(len(self.errors), 1, self.errors)
        self.assertIn(fragment, self.errors[0])
        self.assertEqual(proxy.protocolErrors, 1)
        # The channel keeps working after the bad line.
        d = proxy.request("m", {})
        transport.answer("ok")
        self.assertEqual(self.successResultOf(d), "ok")

    def test_notJSON(self) -> None:
        """A line that is not JSON is a protocol error."""
        self.assertReported(b"hello world\n", "not JSON")

    def test_invalidUTF8(self) -> None:
        """A line that is not UTF-8 is a protocol error."""
        self.assertReported(b'{"a": "\xff"}\n', "not JSON")

    def test_notObject(self) -> None:
        """A JSON value that is not an object is a protocol error."""
        self.assertReported(b"[1, 2]\n", "not a JSON object")

    def test_notJSONRPC2(self) -> None:
        """An object without jsonrpc 2.0 is a protocol error."""
        self.assertReported(b'{"jsonrpc": "1.0", "method": "x"}\n', "not JSON-RPC 2.0")

    def test_neitherMethodNorId(self) -> None:
        """An object that is neither request, notification nor response is an error."""
        self.assertReported(b'{"jsonrpc": "2.0", "result": 1}\n', "not JSON-RPC 2.0")

    def test_nonStringMethod(self) -> None:
        """A notification whose method is not a string is a protocol error."""
        self.assertReported(b'{"jsonrpc": "2.0", "method": 5}\n', "not JSON-RPC 2.0")

    def test_overLongLine(self) -> None:
        """A line over 1 MiB, even arriving in pieces, is dropped and reported once."""
        proxy, transport = self.started()
        d = proxy.request("m", {})
        chunk = b"x" * (1 << 19)
        for _ in range(3):
            transport.stdout(chunk)
        transport.stdout(b"tail\n" + jsonrpc.encode(jsonrpc.result(2, "ok")))
        self.assertEqual(len(self.errors), 1)
        self.assertIn("over 1048576 bytes", self.errors[0])
        self.assertEqual(self.successResultOf(d), "ok")
        transport.stdout(b"y" * ((1 << 20) + 1) + b"\n")
        self.assertEqual(proxy.protocolErrors, 2)

    def test_unknownId(self) -> None:
        """A response to an id never issued is a protocol error."""
        self.assertReported(jsonrpc.encode(jsonrpc.result(99, None)), "unknown id 99")

    def test_nullId(self) -> None:
        """A response with a null id is a protocol error."""
        self.assertReported(jsonrpc.encode(jsonrpc.error(None, -32700, "x")), "unknown id None")

    def test_duplicate(self) -> None:
        """A second response to an answered id is a protocol error."""
        self.assertReported(jsonrpc.encode(jsonrpc.result(1, None)), "duplicate response to id 1")

    def test_malformedResponse(self) -> None:
        """A malformed response to a pending request fails it with ProtocolError."""
        proxy, transport = self.started()
        d1 = proxy.request("a", {})
        d2 = proxy.request("b", {})
        transport.send({"jsonrpc": "2.0", "id": 2, "result": 1, "error": {}})
        transport.send({"jsonrpc": "2.0", "id": 3, "error": {"code": "x", "message": "m"}})
        self.failureResultOf(d1, ProtocolError)
        self.failureResultOf(d2, ProtocolError)
        self.assertEqual(proxy.protocolErrors, 2)
        self.assertIn("exactly one of result and error", self.errors[0])
        self.assertIn("malformed error object", self.errors[1])

    def test_requestFromProxy(self) -> None:
        """A request from the proxy gets -32601 and is reported."""
        proxy, transport = self.started()
        transport.send(jsonrpc.request(7, "broker/thing", {}))
        self.assertEqual(transport.last(), jsonrpc.error(7, -32601, "method not found"))
        self.assertEqual(self.errors, ["unexpected request from the proxy: broker/thing"])

    def test_unterminatedAtExit(self) -> None:
        """A partial stdout line left at exit is reported."""
        proxy, transport = self.started()
        transport.stdout(b'{"jsonrpc": "2.0"')
        self.assertEqual(self.errors, [])
        transport.end(0)
        self.assertEqual(proxy.protocolErrors, 1)
        self.assertIn("unterminated", self.errors[0])
