"""Tests for nvpair.supervisor.process: the broker's JSON-RPC client and process supervisor."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from twisted.application.internet import backoffPolicy
from twisted.internet.address import _ProcessAddress
from twisted.internet.defer import CancelledError
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IProcessProtocol, IProcessTransport, IReactorProcess
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
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


@implementer(IProcessTransport)
class FakeProcessTransport:
    """An in-memory process transport recording stdin writes, closes and signals."""

    def __init__(self, pid: int, protocol: IProcessProtocol) -> None:
        self.pid: int | None = pid
        self.protocol = protocol
        self.written: list[bytes] = []
        self.stdinClosed = False
        self.signals: list[str | int] = []

    def write(self, data: bytes) -> None:
        assert not self.stdinClosed, "write after closeStdin"
        self.written.append(data)

    def writeSequence(self, data: Iterable[bytes]) -> None:
        for chunk in data:
            self.write(chunk)

    def writeToChild(self, childFD: int, data: bytes) -> None:
        assert childFD == 0
        self.write(data)

    def loseConnection(self) -> None:
        self.closeStdin()

    def getPeer(self) -> _ProcessAddress:
        return _ProcessAddress()

    def getHost(self) -> _ProcessAddress:
        return _ProcessAddress()

    def closeStdin(self) -> None:
        self.stdinClosed = True

    def closeStdout(self) -> None:
        pass

    def closeStderr(self) -> None:
        pass

    def closeChildFD(self, descriptor: int) -> None:
        if descriptor == 0:
            self.closeStdin()

    def signalProcess(self, signalID: str | int) -> None:
        if self.pid is None:
            raise ProcessExitedAlready()
        self.signals.append(signalID)

    # test helpers

    def messages(self) -> list[dict[str, Any]]:
        """Everything written to stdin, one parsed JSON object per line."""
        data = b"".join(self.written)
        assert data == b"" or data.endswith(b"\n")
        return [json.loads(line) for line in data.splitlines()]

    def last(self) -> dict[str, Any]:
        return self.messages()[-1]

    def stdout(self, data: bytes) -> None:
        self.protocol.childDataReceived(1, data)

    def stderr(self, data: bytes) -> None:
        self.protocol.childDataReceived(2, data)

    def send(self, message: dict[str, Any]) -> None:
        self.stdout(jsonrpc.encode(message))

    def answer(self, value: object = None, id: int | None = None) -> None:
        """Answer request ``id`` (default: the last message written) with ``value``."""
        self.send(jsonrpc.result(self.last()["id"] if id is None else id, value))

    def end(self, exitCode: int | None = 0, signal: int | None = None) -> None:
        self.pid = None
        reason: Exception
        if exitCode == 0 and signal is None:
            reason = ProcessDone(0)
        else:
            reason = ProcessTerminated(exitCode, signal)
        self.protocol.processEnded(Failure(reason))


@attrs.define
class Spawn:
    protocol: IProcessProtocol
    executable: str
    args: list[str]
    env: Mapping[str, str] | None
    path: str | None
    transport: FakeProcessTransport


@implementer(IReactorProcess)
class ProcessReactor(MemoryReactorClock):
    """A MemoryReactorClock whose spawnProcess hands out FakeProcessTransports."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[Spawn] = []

    def spawnProcess(
        self,
        processProtocol: IProcessProtocol,
        executable: bytes | str,
        args: Sequence[bytes | str] = (),
        env: Mapping[Any, Any] | None = None,
        path: bytes | str | None = None,
        uid: int | None = None,
        gid: int | None = None,
        usePTY: bool = False,
        childFDs: Mapping[int, int | str] | None = None,
    ) -> FakeProcessTransport:
        transport = FakeProcessTransport(1000 + len(self.spawned), processProtocol)
        self.spawned.append(
            Spawn(
                processProtocol,
                str(executable),
                [str(a) for a in args],
                env,
                None if path is None else str(path),
                transport,
            )
        )
        processProtocol.makeConnection(transport)
        return transport

    @property
    def transport(self) -> FakeProcessTransport:
        return self.spawned[-1].transport


class Harness(SynchronousTestCase):
    """Shared set-up: a fake reactor and a ProxyProcess recording its callbacks."""

    def setUp(self) -> None:
        self.reactor = ProcessReactor()
        self.logs: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.crashes: list[ExitInfo] = []

    def make(self, **kwargs: Any) -> ProxyProcess:
        kwargs.setdefault("onLog", self.logs.append)
        kwargs.setdefault("onProtocolError", self.errors.append)
        kwargs.setdefault("onCrash", self.crashes.append)
        return ProxyProcess(self.reactor, ["--state-dir", "/s"], **kwargs)

    def started(self, **kwargs: Any) -> tuple[ProxyProcess, FakeProcessTransport]:
        proxy = self.make(**kwargs)
        d = proxy.start()
        self.reactor.transport.answer({})
        self.successResultOf(d)
        return proxy, self.reactor.transport


class StartTests(Harness):
    """Spawning and the start handshake."""

    def test_command(self) -> None:
        """The proxy runs as twistd beside sys.executable, with the environment passed on."""
        proxy = self.make(path="/work/dir")
        proxy.start()
        spawn = self.reactor.spawned[0]
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        self.assertEqual(spawn.executable, twistd)
        self.assertEqual(
            spawn.args, [twistd, "-n", "--pidfile=", "nvpair-proxy", "--state-dir", "/s"]
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


class NotificationTests(Harness):
    """Routing notifications from the proxy."""

    def test_byName(self) -> None:
        """A subscription by name receives only that method, until unsubscribed."""
        proxy, transport = self.started()
        got: list[tuple[str, object]] = []
        unsubscribe = proxy.subscribe("ollama:ready", lambda m, p: got.append((m, p)))
        transport.send(jsonrpc.notification("lmstudio:ready", {"port": 1}))
        transport.send(jsonrpc.notification("ollama:ready", {"port": 11434, "aliases": []}))
        self.assertEqual(got, [("ollama:ready", {"port": 11434, "aliases": []})])
        unsubscribe()
        unsubscribe()
        transport.send(jsonrpc.notification("ollama:ready", {"port": 2}))
        self.assertEqual(len(got), 1)

    def test_byPredicate(self) -> None:
        """A predicate subscription receives every method it accepts, params or not."""
        proxy, transport = self.started()
        got: list[tuple[str, object]] = []
        proxy.subscribe(lambda m: m.startswith("workload:"), lambda m, p: got.append((m, p)))
        transport.send(jsonrpc.notification("workload:started", {"id": "1"}))
        transport.send(jsonrpc.notification("errors:report", {"kind": "protocol"}))
        transport.send({"jsonrpc": "2.0", "method": "workload:completed"})
        self.assertEqual(got, [("workload:started", {"id": "1"}), ("workload:completed", None)])
        self.assertEqual(self.errors, [])

    def test_raisingSubscriber(self) -> None:
        """A subscriber that raises is logged and does not stop the others."""
        proxy, transport = self.started()
        got: list[str] = []

        def explode(method: str, params: object) -> None:
            raise ZeroDivisionError(method)

        proxy.subscribe("errors:report", explode)
        proxy.subscribe("errors:report", lambda m, p: got.append(m))
        transport.send(jsonrpc.notification("errors:report", {}))
        self.assertEqual(got, ["errors:report"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_nextNotification(self) -> None:
        """nextNotification fires with the first matching params and then unsubscribes."""
        proxy, transport = self.started()
        d = proxy.nextNotification("ollama:ready", lambda p: p == {"port": 2})
        transport.send(jsonrpc.notification("ollama:ready", {"port": 1}))
        self.assertNoResult(d)
        transport.send(jsonrpc.notification("ollama:ready", {"port": 2}))
        self.assertEqual(self.successResultOf(d), {"port": 2})
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_nextNotificationTimeout(self) -> None:
        """nextNotification fails with RequestTimeout and stops listening."""
        proxy, transport = self.started()
        d = proxy.nextNotification("ollama:ready", timeout=4.0)
        self.reactor.advance(4)
        self.assertEqual(self.failureResultOf(d, RequestTimeout).value.method, "ollama:ready")
        transport.send(jsonrpc.notification("ollama:ready", {}))

    def test_nextNotificationCancel(self) -> None:
        """Cancelling nextNotification removes its timer and subscription."""
        proxy, transport = self.started()
        d = proxy.nextNotification("ollama:ready")
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        transport.send(jsonrpc.notification("ollama:ready", {}))


class LogTests(Harness):
    """stderr log lines."""

    def test_jsonLines(self) -> None:
        """JSON stderr lines, split anywhere, reach onLog as dicts."""
        _, transport = self.started()
        transport.stderr(b'{"level": "info", "ev')
        self.assertEqual(self.logs, [])
        transport.stderr(b'ent": "a"}\n{"level": "debug"}\r\n\n{"lev')
        transport.stderr(b'el": "warn"}\n')
        self.assertEqual(
            self.logs,
            [{"level": "info", "event": "a"}, {"level": "debug"}, {"level": "warn"}],
        )

    def test_rawLines(self) -> None:
        """Non-JSON and non-object stderr lines arrive as raw records."""
        _, transport = self.started()
        transport.stderr(b"Traceback (most recent call last):\n[1]\n")
        self.assertEqual(
            self.logs,
            [
                {"level": "raw", "line": "Traceback (most recent call last):"},
                {"level": "raw", "line": "[1]"},
            ],
        )

    def test_partialAtExit(self) -> None:
        """An unterminated last stderr line is delivered when the process ends."""
        proxy, transport = self.started()
        transport.stderr(b"dying words")
        transport.end(1)
        self.assertEqual(self.logs, [{"level": "raw", "line": "dying words"}])
        self.assertEqual(proxy.protocolErrors, 0)

    def test_overLong(self) -> None:
        """An over-long stderr line is dropped with a raw marker record."""
        _, transport = self.started()
        transport.stderr(b"z" * ((1 << 20) + 10) + b"\n{}\n")
        self.assertEqual(
            self.logs, [{"level": "raw", "line": "<line over 1048576 bytes dropped>"}, {}]
        )


class StopTests(Harness):
    """Stopping the process."""

    def test_stopClosesStdin(self) -> None:
        """stop() closes stdin and fires with the exit code once the process exits."""
        proxy, transport = self.started()
        d = proxy.stop()
        self.assertTrue(transport.stdinClosed)
        self.assertNoResult(d)
        self.failureResultOf(proxy.request("m", {}), ProcessGone)
        proxy.notify("workload:x", {})
        transport.end(0)
        self.assertEqual(self.successResultOf(d), 0)
        self.assertEqual(transport.signals, [])
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.assertEqual(self.successResultOf(proxy.whenExited()), 0)

    def test_killAfterTimeout(self) -> None:
        """A process still alive after the timeout gets SIGKILL; stop fires with None."""
        proxy, transport = self.started()
        d = proxy.stop(timeout=2.0)
        exited = proxy.whenExited()
        self.reactor.advance(1.9)
        self.assertEqual(transport.signals, [])
        self.reactor.advance(0.1)
        self.assertEqual(transport.signals, ["KILL"])
        self.assertNoResult(d)
        transport.end(None, 9)
        self.assertIsNone(self.successResultOf(d))
        self.assertIsNone(self.successResultOf(exited))

    def test_stopPendingFail(self) -> None:
        """Requests pending at stop fail with ProcessGone when the process ends."""
        proxy, transport = self.started()
        d = proxy.request("m", {})
        proxy.stop()
        self.assertNoResult(d)
        transport.end(0)
        self.failureResultOf(d, ProcessGone)

    def test_noRestartAfterStop(self) -> None:
        """An exit after stop() is no crash and starts nothing."""
        proxy, transport = self.started(restartPolicy=lambda attempt: 1.0)
        proxy.stop()
        transport.end(0)
        self.reactor.advance(100)
        self.assertEqual((len(self.reactor.spawned), self.crashes), (1, []))

    def test_stopCancelsPendingRestart(self) -> None:
        """stop() during the backoff delay cancels the restart and fails whenRunning."""
        proxy, transport = self.started(restartPolicy=lambda attempt: 5.0)
        transport.end(1)
        running = proxy.whenRunning()
        self.assertEqual(self.successResultOf(proxy.stop()), 1)
        self.failureResultOf(running, ProcessGone)
        self.reactor.advance(100)
        self.assertEqual(len(self.reactor.spawned), 1)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_stopDuringStart(self) -> None:
        """stop() before the handshake answer fails start() and leaves no supervision."""
        proxy = self.make(restartPolicy=lambda attempt: 1.0)
        d = proxy.start()
        transport = self.reactor.transport
        stopped = proxy.stop()
        transport.answer({})
        self.failureResultOf(d, ProcessGone)
        self.assertEqual(transport.signals, [])
        transport.end(0)
        self.assertEqual(self.successResultOf(stopped), 0)
        self.reactor.advance(100)
        self.assertEqual((len(self.reactor.spawned), self.crashes), (1, []))

    def test_stopNeverStarted(self) -> None:
        """stop() with no process fires with None at once."""
        self.assertIsNone(self.successResultOf(self.make().stop()))


class SuperviseTests(Harness):
    """Crash reporting, restart with backoff, and replay of broker-owned state."""

    def configure(self, proxy: ProxyProcess, transport: FakeProcessTransport) -> None:
        """Drive a realistic configuration through the proxy, answering each request."""
        d = proxy.request("facade/enable", {"engine": "ollama", "port": 0, "aliases": ["a"]})
        transport.answer({"engine": "ollama", "port": 11434, "aliases": ["a"]})
        self.successResultOf(d)
        d = proxy.request(
            "facade/enable", {"engine": "llamacpp", "port": 8090, "ignorePersistedPort": True}
        )
        transport.answer({"engine": "llamacpp", "port": 8090, "aliases": []})
        self.successResultOf(d)
        d = proxy.request("facade/enable", {"engine": "lmstudio", "port": 1})
        transport.send(jsonrpc.error(transport.last()["id"], -32010, "bind failed"))
        self.failureResultOf(d, JSONRPCError)
        d = proxy.request("ollama:set-port", {"port": 0})
        transport.answer({"port": 11500})
        self.successResultOf(d)
        proxy.notify("llamacpp:discovery:nodes", {"nodes": [{"id": "old"}]})
        proxy.notify("ollama:node/set-local-backend", {"url": "http://127.0.0.1:11435"})
        proxy.notify("ollama:node/select", {"nodeId": "n1"})
        proxy.notify("ollama:discovery:nodes", {"nodes": [{"id": "n1"}]})
        proxy.notify("llamacpp:discovery:nodes", {"nodes": [{"id": "new"}]})
        proxy.notify("node/set-priority", {"generation": 1, "order": [], "load": {}})
        proxy.notify("node/set-priority", {"generation": 2, "order": ["n1"], "load": {}})
        proxy.notify("log/set-level", {"level": "debug"})
        proxy.notify("workload:whatever", {})

    def test_restartReplays(self) -> None:
        """After a crash the new process gets the handshake and replay, in order."""
        policy = backoffPolicy(initialDelay=2.0, factor=2.0, jitter=lambda: 0.0)
        proxy, old = self.started(restartPolicy=policy)
        self.configure(proxy, old)
        pending = proxy.request("m", {})
        self.successResultOf(proxy.whenRunning())
        old.end(3)
        running = proxy.whenRunning()
        self.failureResultOf(pending, ProcessGone)
        self.assertEqual(self.crashes, [ExitInfo(3, None)])
        self.assertIsNone(proxy.pid)
        self.reactor.advance(1.99)
        self.assertEqual(len(self.reactor.spawned), 1)
        self.reactor.advance(0.01)
        self.assertEqual(len(self.reactor.spawned), 2)
        new = self.reactor.transport
        self.assertEqual(new.messages(), [jsonrpc.request(7, "log/set-level", {"level": "debug"})])
        new.answer({})
        new.answer({"engine": "ollama", "port": 11500, "aliases": ["a"]})
        self.assertNoResult(running)
        new.answer({"engine": "llamacpp", "port": 8090, "aliases": []})
        self.successResultOf(running)
        self.assertEqual(
            new.messages(),
            [
                jsonrpc.request(7, "log/set-level", {"level": "debug"}),
                jsonrpc.request(
                    8, "facade/enable", {"engine": "ollama", "port": 11500, "aliases": ["a"]}
                ),
                jsonrpc.request(
                    9,
                    "facade/enable",
                    {"engine": "llamacpp", "port": 8090, "ignorePersistedPort": True},
                ),
                jsonrpc.notification("llamacpp:discovery:nodes", {"nodes": [{"id": "new"}]}),
                jsonrpc.notification("ollama:discovery:nodes", {"nodes": [{"id": "n1"}]}),
                jsonrpc.notification("ollama:node/select", {"nodeId": "n1"}),
                jsonrpc.notification(
                    "ollama:node/set-local-backend", {"url": "http://127.0.0.1:11435"}
                ),
                jsonrpc.notification(
                    "node/set-priority", {"generation": 2, "order": ["n1"], "load": {}}
                ),
                jsonrpc.notification("log/set-level", {"level": "debug"}),
            ],
        )
        self.assertEqual(self.crashes, [ExitInfo(3, None)])
        self.assertEqual(proxy.pid, 1001)

    def test_replayUsesLatestBoundPort(self) -> None:
        """The port a replayed enable bound becomes the port replayed next time."""
        proxy, old = self.started(restartPolicy=lambda attempt: 1.0)
        d = proxy.request("facade/enable", {"engine": "ollama", "port": 0})
        old.answer({"engine": "ollama", "port": 11434, "aliases": []})
        self.successResultOf(d)
        old.end(1)
        self.reactor.advance(1)
        second = self.reactor.transport
        second.answer({})
        self.assertEqual(second.last()["params"], {"engine": "ollama", "port": 11434})
        second.answer({"engine": "ollama", "port": 11999, "aliases": []})
        second.end(None, 11)
        self.reactor.advance(1)
        third = self.reactor.transport
        third.answer({})
        self.assertEqual(third.last()["params"], {"engine": "ollama", "port": 11999})
        self.assertEqual(self.crashes, [ExitInfo(1, None), ExitInfo(None, 11)])

    def test_logLevelRequestReplayed(self) -> None:
        """A successful log/set-level request is replayed as a request, awaited."""
        proxy, old = self.started(restartPolicy=lambda attempt: 1.0)
        d = proxy.request("log/set-level", {"level": "warn"})
        old.answer({})
        self.successResultOf(d)
        failed = proxy.request("log/set-level", {"level": "bogus"})
        old.send(jsonrpc.error(old.last()["id"], -32602, "bad level"))
        self.failureResultOf(failed, JSONRPCError)
        old.end(1)
        self.reactor.advance(1)
        new = self.reactor.transport
        running = proxy.whenRunning()
        new.answer({})
        self.assertNoResult(running)
        new.send(jsonrpc.error(new.last()["id"], -32602, "whatever"))
        self.successResultOf(running)
        self.assertEqual(
            [(m["method"], m["params"], "id" in m) for m in new.messages()],
            [
                ("log/set-level", {"level": "warn"}, True),
                ("log/set-level", {"level": "warn"}, True),
            ],
        )
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_notifyWhileDownIsReplayed(self) -> None:
        """A state notification sent while no process runs reaches the next one."""
        proxy, old = self.started(restartPolicy=lambda attempt: 1.0)
        old.end(1)
        proxy.notify("ollama:node/select", {"nodeId": None})
        self.reactor.advance(1)
        new = self.reactor.transport
        new.answer({})
        self.assertEqual(new.last(), jsonrpc.notification("ollama:node/select", {"nodeId": None}))
        self.successResultOf(proxy.whenRunning())

    def test_backoffAndReset(self) -> None:
        """Each failed restart waits longer; a successful start resets the attempt count."""
        policy = backoffPolicy(initialDelay=2.0, factor=3.0, jitter=lambda: 0.0)
        proxy, first = self.started(restartPolicy=policy)
        first.end(1)
        self.reactor.advance(2)
        self.reactor.transport.end(1)  # dies before its handshake
        self.reactor.advance(5.9)
        self.assertEqual(len(self.reactor.spawned), 2)
        self.reactor.advance(0.1)
        self.assertEqual(len(self.reactor.spawned), 3)
        self.reactor.transport.answer({})
        self.successResultOf(proxy.whenRunning())
        self.reactor.transport.end(1)
        self.reactor.advance(2)
        self.assertEqual(len(self.reactor.spawned), 4)
        self.assertEqual(len(self.crashes), 3)

    def test_restartHandshakeTimeout(self) -> None:
        """A restarted process that never answers is killed and counted as a crash."""
        proxy, first = self.started(restartPolicy=lambda attempt: 1.0, requestTimeout=5.0)
        first.end(1)
        self.reactor.advance(1)
        second = self.reactor.transport
        self.reactor.advance(5)
        self.assertEqual(second.signals, ["KILL"])
        self.assertEqual(len(self.flushLoggedErrors(RequestTimeout)), 1)
        second.end(None, 9)
        self.assertEqual(self.crashes, [ExitInfo(1, None), ExitInfo(None, 9)])
        self.reactor.advance(1)
        self.assertEqual(len(self.reactor.spawned), 3)

    def test_crashWithoutPolicy(self) -> None:
        """Without a restart policy a crash is reported once and nothing restarts."""
        proxy, transport = self.started()
        transport.end(0)
        self.assertEqual(self.crashes, [ExitInfo(0, None)])
        running = proxy.whenRunning()
        self.assertNoResult(running)
        self.reactor.advance(100)
        self.assertEqual(len(self.reactor.spawned), 1)
        self.assertEqual(self.successResultOf(proxy.stop()), 0)
        self.failureResultOf(running, ProcessGone)
