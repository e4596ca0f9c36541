"""The broker's side of the stdio JSON-RPC channel: spawn, talk to and supervise a proxy.

``ProxyProcess`` runs ``twistd --reactor=nvpair -n --pidfile= nvpair-proxy ARGV`` (the
proxy's reactor, ``runtime.eventloop``) with stdin/stdout as the
JSON-RPC line channel (protocol §1-§5) and stderr as JSON log lines (§10).  Requests are
matched to responses by an increasing integer id; notifications from the proxy are routed to
subscribers.  With a restart policy, a process that exits without ``stop()`` is restarted
and the broker-owned state that went through this object is replayed to it.

One process's channel is ``supervisor.channel.ProxyChannel`` (which also defines the errors
re-exported here); the recorded state is ``supervisor.replay.ReplayState``.  ``lifecycle``
says whether a process runs and whether its exit would be a crash.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from enum import Enum

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorProcess, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.proxy.broker.jsonrpc import notification
from nvpair.proxy.engines import ENGINES as _ENGINE_TABLE
from nvpair.supervisor.channel import (
    ChannelState,
    ExitInfo,
    JSONRPCError,
    ProcessGone,
    ProtocolError,
    ProxyChannel,
    RequestIds,
    RequestTimeout,
)
from nvpair.supervisor.notify import NotificationRouter
from nvpair.supervisor.replay import ReplayState, answered

ENGINES = frozenset(_ENGINE_TABLE)


class Lifecycle(Enum):
    """Whether a ``ProxyProcess`` runs a proxy, and whether an exit is then a crash."""

    IDLE = "idle"  # not started, stopped, failed to start, or crashed with no restart policy
    STARTING = "starting"  # the first process is being spawned and handshaken
    SUPERVISING = "supervising"  # started: an exit not asked for is a crash (restarted)


class ProxyProcess(NotificationRouter):
    """Spawn an nvpair-proxy under ``twistd``, talk JSON-RPC to it, and supervise it."""

    _log = Logger()

    def __init__(
        self,
        reactor: IReactorProcess,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        executable: str | None = None,
        path: str | None = None,
        onLog: Callable[[dict[str, object]], None] | None = None,
        onProtocolError: Callable[[str], None] | None = None,
        requestTimeout: float = 30.0,
        restartPolicy: Callable[[int], float] | None = None,
        onCrash: Callable[[ExitInfo], None] | None = None,
    ) -> None:
        super().__init__(IReactorTime(reactor))
        self._reactor = reactor
        self.executable = executable or os.path.join(os.path.dirname(sys.executable), "twistd")
        self.command: list[str] = [
            self.executable,
            "--reactor=nvpair",
            "-n",
            "--pidfile=",
            "nvpair-proxy",
            *argv,
        ]
        self._env = dict(os.environ if env is None else env)
        self._path = path
        self._onLog = onLog
        self._onProtocolError = onProtocolError
        self.requestTimeout = requestTimeout
        self._restartPolicy = restartPolicy
        self._onCrash = onCrash
        self.protocolErrors = 0
        self.lateResponses = 0
        self.crashes = 0
        self._ids = RequestIds()
        self._current: ProxyChannel | None = None
        self.lifecycle = Lifecycle.IDLE
        self._attempt = 0
        self._restartCall: IDelayedCall | None = None
        self._runningWaiters: list[Deferred[None]] = []
        self._replay = ReplayState(self._log)

    # -- process lifecycle -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The running process's pid, or None."""
        proto = self._current
        if proto is None or not proto.alive or proto.transport is None:
            return None
        pid: int | None = proto.transport.pid
        return pid

    @property
    def pendingRequests(self) -> int:
        """How many requests to the current process await an answer."""
        return 0 if self._current is None else len(self._current.pending)

    def start(self) -> Deferred[None]:
        """Spawn the proxy; fire once a ``log/set-level`` round trip has completed.

        If this first process exits or fails its handshake, the Deferred fails (a timed-out
        process is killed first) and no restart is attempted; supervision begins once the
        first start has succeeded.
        """
        if self.lifecycle is not Lifecycle.IDLE:
            return fail(RuntimeError("ProxyProcess already started"))
        self.lifecycle = Lifecycle.STARTING
        return Deferred.fromCoroutine(self._startFirst())

    async def _startFirst(self) -> None:
        try:
            proto = self._spawn()
        except BaseException:
            self.lifecycle = Lifecycle.IDLE
            raise
        try:
            await self._bringUp(proto, replay=False)
        except Exception as e:
            self.lifecycle = Lifecycle.IDLE
            if proto.state is not ChannelState.CLOSING:  # else stop() is already ending it
                await self._killAndWait(proto)
            self._failRunningWaiters(e if isinstance(e, ProcessGone) else None)
            raise
        self.lifecycle = Lifecycle.SUPERVISING

    def _spawn(self) -> ProxyChannel:
        proto = ProxyChannel(self, self._ids, self._clock)
        self._current = proto
        try:
            self._reactor.spawnProcess(
                proto, self.executable, self.command, env=self._env, path=self._path
            )
        except BaseException:
            self._current = None
            raise
        return proto

    async def _bringUp(self, proto: ProxyChannel, replay: bool) -> None:
        await answered(proto.send("log/set-level", self._replay.logLevel, self.requestTimeout))
        if replay:
            await self._replay.replayTo(proto, self.requestTimeout)
        if proto is not self._current or not proto.writable:
            raise ProcessGone("process stopped or ended during start", proto.exitInfo)
        proto.started()
        self._attempt = 0
        waiters, self._runningWaiters = self._runningWaiters, []
        for d in waiters:
            d.callback(None)

    async def _killAndWait(self, proto: ProxyChannel) -> None:
        if proto.exitInfo is not None or proto.transport is None:
            return
        proto.kill()
        await proto.whenEnded()

    def _processEnded(self, proto: ProxyChannel, exitInfo: ExitInfo) -> None:
        unexpected = self.lifecycle is Lifecycle.SUPERVISING and proto is self._current
        proto.failPending(lambda: ProcessGone("proxy process ended", exitInfo))
        if not unexpected:
            return
        self.crashes += 1
        if self._onCrash is not None:
            try:
                self._onCrash(exitInfo)
            except Exception:
                self._log.failure("onCrash callback raised")
        if self._restartPolicy is None:
            self.lifecycle = Lifecycle.IDLE
            self._failRunningWaiters(ProcessGone("proxy process crashed", exitInfo))
            return
        self._scheduleRestart()

    def _scheduleRestart(self) -> None:
        assert self._restartPolicy is not None
        delay = self._restartPolicy(self._attempt)
        self._attempt += 1
        self._restartCall = self._clock.callLater(delay, self._restart)

    def _restart(self) -> None:
        self._restartCall = None
        try:
            proto = self._spawn()
        except Exception:
            self._log.failure("respawning the proxy failed")
            self._scheduleRestart()
            return
        d = Deferred.fromCoroutine(self._bringUp(proto, replay=True))
        d.addErrback(self._restartFailed, proto)

    def _restartFailed(self, reason: Failure, proto: ProxyChannel) -> None:
        if isinstance(reason.value, ProcessGone):
            return  # the exit was handled as a crash already
        self._log.failure("restarted proxy failed its handshake; killing it", reason)
        Deferred.fromCoroutine(self._killAndWait(proto))

    def whenRunning(self) -> Deferred[None]:
        """Fire when a (re)started process has completed its handshake and replay."""
        proto = self._current
        if proto is not None and proto.state is ChannelState.READY:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._runningWaiters.append(d)
        return d

    def _failRunningWaiters(self, reason: ProcessGone | None) -> None:
        waiters, self._runningWaiters = self._runningWaiters, []
        for d in waiters:
            d.errback(reason or ProcessGone("proxy did not start"))

    def whenExited(self) -> Deferred[int | None]:
        """Fire with the current process's exit code (None if killed by a signal)."""
        proto = self._current
        if proto is None:
            return succeed(None)
        return proto.whenEnded().addCallback(lambda info: info.exitCode)

    def stop(self, timeout: float = 5.0) -> Deferred[int | None]:
        """Close stdin, wait for exit, SIGKILL after ``timeout``; no restart afterwards."""
        self.lifecycle = Lifecycle.IDLE
        if self._restartCall is not None:
            self._restartCall.cancel()
            self._restartCall = None
        self._failRunningWaiters(ProcessGone("stopped"))
        proto = self._current
        if proto is None:
            return succeed(None)
        if proto.writable:
            proto.closeStdin()
            killer = self._clock.callLater(timeout, proto.kill)

            def disarm(info: ExitInfo) -> ExitInfo:
                if killer.active():
                    killer.cancel()
                return info

            proto.whenEnded().addCallback(disarm)
        return self.whenExited()

    # -- sending -----------------------------------------------------------------------

    def request(
        self, method: str, params: object, timeout: float | None = None
    ) -> Deferred[object]:
        """Send a request; fire with its result or fail with ``JSONRPCError``.

        Fails with ``RequestTimeout`` after ``timeout`` (default ``requestTimeout``) and with
        ``ProcessGone`` if no process is running or it ends first.  Successful state-setting
        requests are recorded for replay after a restart.
        """
        params = copy.deepcopy(params)
        proto = self._current
        if proto is None or not proto.writable:
            return fail(ProcessGone("proxy process is not running"))
        d = proto.send(method, params, self.requestTimeout if timeout is None else timeout)

        def record(value: object) -> object:
            self._replay.recordAnswer(method, params, value)
            return value

        return d.addCallback(record)

    def notify(self, method: str, params: object) -> None:
        """Send a notification; state-setting ones are recorded for replay.

        Without a running process the message is not sent (a recorded one reaches the next
        process through replay) and the drop is logged.
        """
        params = copy.deepcopy(params)
        self._replay.recordNotification(method, params)
        proto = self._current
        if proto is None or not proto.writable:
            self._log.warn("notification {method} not sent: no running proxy", method=method)
            return
        proto.write(notification(method, params))

    def writeRaw(self, data: bytes) -> None:
        """Write bytes to the running proxy's stdin as they are (tests feed it bad input)."""
        proto = self._current
        if proto is None or not proto.writable or proto.transport is None:
            raise ProcessGone("proxy process is not running")
        proto.transport.write(data)

    # -- what the channel reports --------------------------------------------------------

    def _protocolError(self, description: str) -> None:
        self.protocolErrors += 1
        if self._onProtocolError is not None:
            self._onProtocolError(description)
        else:
            self._log.warn("proxy protocol error: {description}", description=description)

    def _logReceived(self, record: dict[str, object]) -> None:
        if self._onLog is not None:
            self._onLog(record)
        else:
            self._log.info("proxy log: {record}", record=record)

    def _lateResponse(self) -> None:
        self.lateResponses += 1


__all__ = [
    "ENGINES",
    "ChannelState",
    "ExitInfo",
    "JSONRPCError",
    "Lifecycle",
    "ProcessGone",
    "ProtocolError",
    "ProxyProcess",
    "RequestTimeout",
]
