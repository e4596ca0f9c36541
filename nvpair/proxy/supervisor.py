"""The broker's side of the stdio JSON-RPC channel: spawn, talk to and supervise a proxy.

``ProxyProcess`` runs ``twistd -n --pidfile= nvpair-proxy ARGV`` with stdin/stdout as the
JSON-RPC line channel (protocol §1-§5) and stderr as JSON log lines (§10).  Requests are
matched to responses by an increasing integer id; notifications from the proxy are routed to
subscribers.  With a restart policy, a process that exits without ``stop()`` is restarted
and the broker-owned state that went through this object is replayed to it.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall, IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.proxy.jsonrpc import MAX_LINE, METHOD_NOT_FOUND, LineFramer, encode, error
from nvpair.proxy.jsonrpc import notification as _notification
from nvpair.proxy.jsonrpc import request as _request

ENGINES = frozenset({"ollama", "lmstudio", "llamacpp"})
_ENGINE_STATE = ("discovery:nodes", "node/select", "node/set-local-backend")
_DEFAULT_LEVEL: dict[str, Any] = {"level": "info"}


@attrs.frozen
class ExitInfo:
    """How a proxy process ended: an exit code, or the signal that killed it."""

    exitCode: int | None
    signal: int | None

    @classmethod
    def fromFailure(cls, reason: Failure) -> ExitInfo:
        """Read the exit status out of ``processEnded``'s reason."""
        value = reason.value
        if isinstance(value, ProcessDone):
            return cls(0, None)
        if isinstance(value, ProcessTerminated):
            return cls(value.exitCode, value.signal)
        return cls(None, None)


class JSONRPCError(Exception):
    """The proxy answered a request with a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data


class RequestTimeout(Exception):
    """No answer (or no awaited notification) arrived within the timeout."""

    def __init__(self, method: str, timeout: float, id: int | None = None) -> None:
        super().__init__(method, timeout, id)
        self.method = method
        self.timeout = timeout
        self.id = id


class ProcessGone(Exception):
    """The proxy process is not running (not started, stopping, or ended)."""

    def __init__(self, message: str, exitInfo: ExitInfo | None = None) -> None:
        super().__init__(message, exitInfo)
        self.exitInfo = exitInfo


class ProtocolError(Exception):
    """The proxy answered a pending request with a malformed response."""


@attrs.define
class _Pending:
    method: str
    deferred: Deferred[object]
    timer: IDelayedCall


@attrs.define
class _Sent:
    notify: bool
    method: str
    params: object


class _Lines(LineFramer):
    """Feed complete lines, and a marker for over-long ones, to two callables."""

    def __init__(self, onLine: Callable[[bytes], None], onTooLong: Callable[[], None]) -> None:
        super().__init__()
        self._onLine = onLine
        self._onTooLong = onTooLong

    def lineReceived(self, line: bytes) -> None:
        self._onLine(line)

    def lineTooLong(self) -> None:
        self._onTooLong()


class _ProxyProcessProtocol(ProcessProtocol):
    """One spawned proxy process: its framers, pending requests and exit."""

    def __init__(self, owner: ProxyProcess, firstId: int) -> None:
        self.owner = owner
        self.firstId = firstId
        self.pending: dict[int, _Pending] = {}
        self.timedOut: set[int] = set()
        self.stdinClosed = False
        self.ready = False
        self.exitInfo: ExitInfo | None = None
        self._exitWaiters: list[Deferred[ExitInfo]] = []
        self._stdout = _Lines(self._stdoutLine, self._stdoutTooLong)
        self._stderr = _Lines(self._stderrLine, self._stderrTooLong)

    @property
    def alive(self) -> bool:
        return self.transport is not None and self.exitInfo is None

    def whenEnded(self) -> Deferred[ExitInfo]:
        if self.exitInfo is not None:
            return succeed(self.exitInfo)
        d: Deferred[ExitInfo] = Deferred()
        self._exitWaiters.append(d)
        return d

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        if childFD == 1:
            self._stdout.dataReceived(data)
        elif childFD == 2:
            self._stderr.dataReceived(data)

    def _stdoutLine(self, line: bytes) -> None:
        self.owner._lineReceived(self, line)

    def _stdoutTooLong(self) -> None:
        self.owner._protocolError(f"stdout line over {MAX_LINE} bytes dropped")

    def _stderrLine(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            record = {"level": "raw", "line": text}
        self.owner._logReceived(record)

    def _stderrTooLong(self) -> None:
        self.owner._logReceived({"level": "raw", "line": f"<line over {MAX_LINE} bytes dropped>"})

    def processEnded(self, reason: Failure) -> None:
        if self._stderr.pendingBytes():
            self._stderr.dataReceived(b"\n")
        if self._stdout.pendingBytes():
            self.owner._protocolError(
                f"unterminated stdout line at exit ({self._stdout.pendingBytes()} bytes)"
            )
        self.exitInfo = ExitInfo.fromFailure(reason)
        self.owner._processEnded(self, self.exitInfo)
        waiters, self._exitWaiters = self._exitWaiters, []
        for d in waiters:
            d.callback(self.exitInfo)


def _engineOf(method: str) -> tuple[str, str] | None:
    engine, sep, rest = method.partition(":")
    if sep and engine in ENGINES:
        return engine, rest
    return None


class ProxyProcess:
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
        onLog: Callable[[dict[str, Any]], None] | None = None,
        onProtocolError: Callable[[str], None] | None = None,
        requestTimeout: float = 30.0,
        restartPolicy: Callable[[int], float] | None = None,
        onCrash: Callable[[ExitInfo], None] | None = None,
    ) -> None:
        self._reactor = reactor
        self._clock = IReactorTime(reactor)
        self._executable = executable or os.path.join(os.path.dirname(sys.executable), "twistd")
        self.command: list[str] = [self._executable, "-n", "--pidfile=", "nvpair-proxy", *argv]
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
        self._nextId = 1
        self._current: _ProxyProcessProtocol | None = None
        self._active = False
        self._supervising = False
        self._attempt = 0
        self._restartCall: IDelayedCall | None = None
        self._runningWaiters: list[Deferred[None]] = []
        self._subscriptions: list[tuple[Callable[[str], bool], Callable[[str, object], None]]] = []
        self._facades: dict[str, dict[str, Any]] = {}
        self._engineState: dict[str, dict[str, _Sent]] = {}
        self._priority: _Sent | None = None
        self._logLevel: _Sent | None = None

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
        if self._active:
            return fail(RuntimeError("ProxyProcess already started"))
        self._active = True
        return Deferred.fromCoroutine(self._startFirst())

    async def _startFirst(self) -> None:
        try:
            proto = self._spawn()
        except BaseException:
            self._active = False
            raise
        try:
            await self._bringUp(proto, replay=False)
        except Exception as e:
            self._active = False
            if not proto.stdinClosed:  # else stop() is already ending it
                await self._killAndWait(proto)
            self._failRunningWaiters(e if isinstance(e, ProcessGone) else None)
            raise
        self._supervising = True

    def _spawn(self) -> _ProxyProcessProtocol:
        proto = _ProxyProcessProtocol(self, self._nextId)
        self._current = proto
        try:
            self._reactor.spawnProcess(
                proto, self._executable, self.command, env=self._env, path=self._path
            )
        except BaseException:
            self._current = None
            raise
        return proto

    async def _bringUp(self, proto: _ProxyProcessProtocol, replay: bool) -> None:
        level = self._logLevel.params if self._logLevel is not None else _DEFAULT_LEVEL
        await self._answered(self._send(proto, "log/set-level", level, None))
        if replay:
            await self._replay(proto)
        if proto is not self._current or not proto.alive or proto.stdinClosed:
            raise ProcessGone("process stopped or ended during start", proto.exitInfo)
        proto.ready = True
        self._attempt = 0
        waiters, self._runningWaiters = self._runningWaiters, []
        for d in waiters:
            d.callback(None)

    @staticmethod
    async def _answered(d: Deferred[object]) -> object:
        """Await a request; a JSON-RPC error answer counts as an answer."""
        try:
            return await d
        except JSONRPCError as e:
            return e

    async def _replay(self, proto: _ProxyProcessProtocol) -> None:
        for engine, params in list(self._facades.items()):
            answer = await self._answered(self._send(proto, "facade/enable", params, None))
            if isinstance(answer, JSONRPCError):
                self._log.warn(
                    "replayed facade/enable for {engine} failed: {code} {message}",
                    engine=engine,
                    code=answer.code,
                    message=answer.message,
                )
            else:
                self._recordAnswer("facade/enable", params, answer)
        sent: list[_Sent] = []
        for state in self._engineState.values():
            sent.extend(state[name] for name in _ENGINE_STATE if name in state)
        sent.extend(s for s in (self._priority, self._logLevel) if s is not None)
        for s in sent:
            if s.notify:
                self._write(proto, _notification(s.method, s.params))
            else:
                answer = await self._answered(self._send(proto, s.method, s.params, None))
                if isinstance(answer, JSONRPCError):
                    self._log.warn(
                        "replayed {method} failed: {code} {message}",
                        method=s.method,
                        code=answer.code,
                        message=answer.message,
                    )

    async def _killAndWait(self, proto: _ProxyProcessProtocol) -> None:
        if proto.exitInfo is not None or proto.transport is None:
            return
        try:
            proto.transport.signalProcess("KILL")
        except ProcessExitedAlready:
            pass
        await proto.whenEnded()

    def _processEnded(self, proto: _ProxyProcessProtocol, exitInfo: ExitInfo) -> None:
        unexpected = self._supervising and proto is self._current
        pending, proto.pending = proto.pending, {}
        for p in pending.values():
            p.timer.cancel()
            p.deferred.errback(ProcessGone("proxy process ended", exitInfo))
        if not unexpected:
            return
        self.crashes += 1
        if self._onCrash is not None:
            try:
                self._onCrash(exitInfo)
            except Exception:
                self._log.failure("onCrash callback raised")
        if self._restartPolicy is None:
            self._supervising = self._active = False
            self._failRunningWaiters(ProcessGone("proxy process crashed", exitInfo))
            return
        delay = self._restartPolicy(self._attempt)
        self._attempt += 1
        self._restartCall = self._clock.callLater(delay, self._restart)

    def _restart(self) -> None:
        self._restartCall = None
        try:
            proto = self._spawn()
        except Exception:
            self._log.failure("respawning the proxy failed")
            assert self._restartPolicy is not None
            delay = self._restartPolicy(self._attempt)
            self._attempt += 1
            self._restartCall = self._clock.callLater(delay, self._restart)
            return
        d = Deferred.fromCoroutine(self._bringUp(proto, replay=True))
        d.addErrback(self._restartFailed, proto)

    def _restartFailed(self, reason: Failure, proto: _ProxyProcessProtocol) -> None:
        if isinstance(reason.value, ProcessGone):
            return  # the exit was handled as a crash already
        self._log.failure("restarted proxy failed its handshake; killing it", reason)
        Deferred.fromCoroutine(self._killAndWait(proto))

    def whenRunning(self) -> Deferred[None]:
        """Fire when a (re)started process has completed its handshake and replay."""
        proto = self._current
        if proto is not None and proto.ready and proto.alive:
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
        self._active = self._supervising = False
        if self._restartCall is not None:
            self._restartCall.cancel()
            self._restartCall = None
        self._failRunningWaiters(ProcessGone("stopped"))
        proto = self._current
        if proto is None:
            return succeed(None)
        if proto.alive and not proto.stdinClosed and proto.transport is not None:
            proto.stdinClosed = True
            proto.transport.closeStdin()
            killer = self._clock.callLater(timeout, self._kill, proto)

            def disarm(info: ExitInfo) -> ExitInfo:
                if killer.active():
                    killer.cancel()
                return info

            proto.whenEnded().addCallback(disarm)
        return self.whenExited()

    def _kill(self, proto: _ProxyProcessProtocol) -> None:
        if proto.transport is not None and proto.exitInfo is None:
            try:
                proto.transport.signalProcess("KILL")
            except ProcessExitedAlready:
                pass

    # -- sending -----------------------------------------------------------------------

    def request(self, method: str, params: object, timeout: float | None = None) -> Deferred[Any]:
        """Send a request; fire with its result or fail with ``JSONRPCError``.

        Fails with ``RequestTimeout`` after ``timeout`` (default ``requestTimeout``) and with
        ``ProcessGone`` if no process is running or it ends first.  Successful state-setting
        requests are recorded for replay after a restart.
        """
        params = copy.deepcopy(params)
        proto = self._current
        if proto is None or not proto.alive or proto.stdinClosed:
            return fail(ProcessGone("proxy process is not running"))
        d = self._send(proto, method, params, timeout)

        def record(value: object) -> object:
            self._recordAnswer(method, params, value)
            return value

        return d.addCallback(record)

    def notify(self, method: str, params: object) -> None:
        """Send a notification; state-setting ones are recorded for replay.

        Without a running process the message is not sent (a recorded one reaches the next
        process through replay) and the drop is logged.
        """
        params = copy.deepcopy(params)
        self._recordSent(_Sent(True, method, params))
        proto = self._current
        if proto is None or not proto.alive or proto.stdinClosed:
            self._log.warn("notification {method} not sent: no running proxy", method=method)
            return
        self._write(proto, _notification(method, params))

    def writeRaw(self, data: bytes) -> None:
        """Write bytes to the running proxy's stdin as they are (tests feed it bad input)."""
        proto = self._current
        if proto is None or not proto.alive or proto.stdinClosed or proto.transport is None:
            raise ProcessGone("proxy process is not running")
        proto.transport.write(data)

    def _write(self, proto: _ProxyProcessProtocol, message: dict[str, Any]) -> None:
        if not proto.alive or proto.stdinClosed:
            raise ProcessGone("proxy process is not running", proto.exitInfo)
        line = encode(message)
        if len(line) > MAX_LINE + 1:
            raise ValueError(f"{message.get('method')} message over {MAX_LINE} bytes")
        assert proto.transport is not None
        proto.transport.write(line)

    def _send(
        self, proto: _ProxyProcessProtocol, method: str, params: object, timeout: float | None
    ) -> Deferred[object]:
        if not proto.alive or proto.stdinClosed:
            return fail(ProcessGone("proxy process is not running", proto.exitInfo))
        id = self._nextId
        try:
            self._write(proto, _request(id, method, params))
        except Exception:
            return fail()
        self._nextId += 1
        limit = self.requestTimeout if timeout is None else timeout

        def cancel(d: Deferred[object]) -> None:
            p = proto.pending.pop(id, None)
            if p is not None:
                p.timer.cancel()
                proto.timedOut.add(id)

        def expire() -> None:
            p = proto.pending.pop(id, None)
            if p is not None:
                proto.timedOut.add(id)
                p.deferred.errback(RequestTimeout(method, limit, id))

        d: Deferred[object] = Deferred(cancel)
        proto.pending[id] = _Pending(method, d, self._clock.callLater(limit, expire))
        return d

    # -- replay records ----------------------------------------------------------------

    def _recordSent(self, sent: _Sent) -> None:
        addressed = _engineOf(sent.method)
        if addressed is not None and addressed[1] in _ENGINE_STATE:
            self._engineState.setdefault(addressed[0], {})[addressed[1]] = sent
        elif sent.method == "node/set-priority":
            self._priority = sent
        elif sent.method == "log/set-level":
            self._logLevel = sent

    def _recordAnswer(self, method: str, params: object, value: object) -> None:
        port = value.get("port") if isinstance(value, dict) else None
        if method == "facade/enable":
            if not isinstance(params, dict) or not isinstance(params.get("engine"), str):
                return
            engine = params["engine"]
            if engine not in self._facades:
                self._facades[engine] = dict(params)
            if isinstance(port, int):
                self._facades[engine]["port"] = port
            return
        addressed = _engineOf(method)
        if addressed is not None and addressed[1] == "set-port":
            if addressed[0] in self._facades and isinstance(port, int):
                self._facades[addressed[0]]["port"] = port
            return
        self._recordSent(_Sent(False, method, params))

    # -- receiving ---------------------------------------------------------------------

    def _protocolError(self, description: str) -> None:
        self.protocolErrors += 1
        if self._onProtocolError is not None:
            self._onProtocolError(description)
        else:
            self._log.warn("proxy protocol error: {description}", description=description)

    def _logReceived(self, record: dict[str, Any]) -> None:
        if self._onLog is not None:
            self._onLog(record)
        else:
            self._log.info("proxy log: {record}", record=record)

    def _lineReceived(self, proto: _ProxyProcessProtocol, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self._protocolError(f"stdout line is not JSON: {line[:80]!r}")
            return
        if not isinstance(message, dict):
            self._protocolError(f"stdout line is not a JSON object: {line[:80]!r}")
            return
        if message.get("jsonrpc") != "2.0":
            self._protocolError(f"not JSON-RPC 2.0: {line[:80]!r}")
            return
        if "method" in message:
            method = message["method"]
            if not isinstance(method, str) or "result" in message or "error" in message:
                self._protocolError(f"not JSON-RPC 2.0: {line[:80]!r}")
            elif "id" in message:
                self._protocolError(f"unexpected request from the proxy: {method}")
                if proto.alive and not proto.stdinClosed:
                    self._write(proto, error(message["id"], METHOD_NOT_FOUND, "method not found"))
            else:
                self._dispatch(method, message.get("params"))
            return
        if "id" not in message:
            self._protocolError(f"not JSON-RPC 2.0: {line[:80]!r}")
            return
        self._responseReceived(proto, message)

    def _responseReceived(self, proto: _ProxyProcessProtocol, message: dict[str, Any]) -> None:
        id = message["id"]
        problem = None
        err = message.get("error")
        if ("result" in message) == ("error" in message):
            problem = "needs exactly one of result and error"
        elif "error" in message and not (
            isinstance(err, dict)
            and type(err.get("code")) is int
            and isinstance(err.get("message"), str)
        ):
            problem = "has a malformed error object"
        if type(id) is not int or id not in proto.pending:
            if type(id) is int and id in proto.timedOut:
                proto.timedOut.discard(id)
                self.lateResponses += 1
            elif type(id) is int and proto.firstId <= id < self._nextId:
                self._protocolError(f"duplicate response to id {id}")
            else:
                self._protocolError(f"response to unknown id {id!r}")
            return
        pending = proto.pending.pop(id)
        pending.timer.cancel()
        if problem is not None:
            description = f"response to id {id} ({pending.method}) {problem}"
            self._protocolError(description)
            pending.deferred.errback(ProtocolError(description))
        elif isinstance(err, dict):
            code, text = err["code"], err["message"]
            pending.deferred.errback(JSONRPCError(code, text, err.get("data")))
        else:
            pending.deferred.callback(message["result"])

    # -- notifications -----------------------------------------------------------------

    def subscribe(
        self,
        methodOrPredicate: str | Callable[[str], bool],
        callback: Callable[[str, object], None],
    ) -> Callable[[], None]:
        """Deliver matching notifications as ``callback(method, params)``; return unsubscribe."""
        match: Callable[[str], bool]
        if isinstance(methodOrPredicate, str):
            name = methodOrPredicate
            match = name.__eq__
        else:
            match = methodOrPredicate
        entry = (match, callback)
        self._subscriptions.append(entry)

        def unsubscribe() -> None:
            if entry in self._subscriptions:
                self._subscriptions.remove(entry)

        return unsubscribe

    def nextNotification(
        self,
        method: str,
        predicate: Callable[[object], bool] | None = None,
        timeout: float | None = None,
    ) -> Deferred[Any]:
        """Fire with the params of the next ``method`` notification whose params match.

        Fails with ``RequestTimeout`` after ``timeout`` (default ``requestTimeout``).
        """
        limit = self.requestTimeout if timeout is None else timeout

        def cleanup() -> None:
            unsubscribe()
            if timer.active():
                timer.cancel()

        d: Deferred[Any] = Deferred(lambda _: cleanup())

        def received(_: str, params: object) -> None:
            if predicate is None or predicate(params):
                cleanup()
                d.callback(params)

        def expire() -> None:
            unsubscribe()
            d.errback(RequestTimeout(method, limit))

        unsubscribe = self.subscribe(method, received)
        timer = self._clock.callLater(limit, expire)
        return d

    def _dispatch(self, method: str, params: object) -> None:
        for match, callback in list(self._subscriptions):
            try:
                if match(method):
                    callback(method, params)
            except Exception:
                self._log.failure("notification subscriber for {method} raised", method=method)


__all__ = [
    "ENGINES",
    "ExitInfo",
    "JSONRPCError",
    "ProcessGone",
    "ProtocolError",
    "ProxyProcess",
    "RequestTimeout",
]
