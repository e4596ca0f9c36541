"""Tests for nvpair.supervisor.process: notifications, log records and stopping."""

from __future__ import annotations

from twisted.internet.defer import CancelledError

from nvpair.proxy.broker import jsonrpc
from nvpair.supervisor.process import (
    ProcessGone,
    RequestTimeout,
)
from tests.support.fakeprocess import Harness


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
