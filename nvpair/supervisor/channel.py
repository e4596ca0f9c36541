"""One spawned proxy process as the broker sees it: its stdio channel, requests and exit.

``ProxyChannel`` is the ``ProcessProtocol`` of one process: stdout is framed into JSON-RPC
lines (``jsonrpc.LineFramer``) and validated, responses are matched to pending requests by
id (with their timeouts), notifications and stderr JSON log records are handed to the
owning ``ProxyProcess``, and the exit status is kept.  The outcomes a caller sees
(``JSONRPCError``, ``RequestTimeout``, ``ProcessGone``, ``ProtocolError``, ``ExitInfo``)
are defined here and re-exported by ``nvpair.supervisor.process``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from nvpair.proxy.broker.jsonrpc import (
    MAX_LINE,
    METHOD_NOT_FOUND,
    LineFramer,
    encode,
    error,
    request,
)


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


class ChannelOwner(Protocol):
    """What a ``ProxyChannel`` reports to (the ``ProxyProcess`` that spawned it)."""

    def _protocolError(self, description: str) -> None: ...

    def _logReceived(self, record: dict[str, object]) -> None: ...

    def _dispatch(self, method: str, params: object) -> None: ...

    def _lateResponse(self) -> None: ...

    def _processEnded(self, proto: ProxyChannel, exitInfo: ExitInfo) -> None: ...


class RequestIds:
    """The increasing request ids of one ``ProxyProcess``, across its successive processes."""

    def __init__(self) -> None:
        self.next = 1


@attrs.define
class _Pending:
    """A request awaiting its answer: its method, Deferred and timeout."""

    method: str
    deferred: Deferred[object]
    timer: IDelayedCall


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


class ChannelState(Enum):
    """The life of one spawned process as its channel sees it."""

    SPAWNING = "spawning"  # handed to spawnProcess, not connected yet
    STARTING = "starting"  # running; the start handshake (and any replay) not done yet
    READY = "ready"  # handshake done: the process serves the broker
    CLOSING = "closing"  # stdin closed (its signal to exit): nothing more is written
    ENDED = "ended"  # the process has exited (``exitInfo`` says how)


# The states in which the process runs, and those in which it may be written to.
_ALIVE = frozenset({ChannelState.STARTING, ChannelState.READY, ChannelState.CLOSING})
_WRITABLE = frozenset({ChannelState.STARTING, ChannelState.READY})


class ProxyChannel(ProcessProtocol):
    """One spawned proxy process: its framers, pending requests and exit."""

    def __init__(self, owner: ChannelOwner, ids: RequestIds, clock: IReactorTime) -> None:
        self.owner = owner
        self.ids = ids
        self.firstId = ids.next
        self.clock = clock
        self.pending: dict[int, _Pending] = {}
        self.timedOut: set[int] = set()
        self.state = ChannelState.SPAWNING
        self.exitInfo: ExitInfo | None = None
        self._exitWaiters: list[Deferred[ExitInfo]] = []
        self._stdout = _Lines(self.lineReceived, self._stdoutTooLong)
        self._stderr = _Lines(self._stderrLine, self._stderrTooLong)

    def connectionMade(self) -> None:
        self.state = ChannelState.STARTING

    @property
    def alive(self) -> bool:
        """Whether the process has been spawned and has not ended."""
        return self.state in _ALIVE

    @property
    def writable(self) -> bool:
        """Whether messages can be written to the process's stdin."""
        return self.state in _WRITABLE

    def started(self) -> None:
        """The start handshake (and replay) completed: the process serves the broker."""
        self.state = ChannelState.READY

    def whenEnded(self) -> Deferred[ExitInfo]:
        """Fire with the exit status once the process has ended."""
        if self.exitInfo is not None:
            return succeed(self.exitInfo)
        d: Deferred[ExitInfo] = Deferred()
        self._exitWaiters.append(d)
        return d

    def closeStdin(self) -> None:
        """Close the process's stdin (its signal to exit); nothing is written after."""
        self.state = ChannelState.CLOSING
        assert self.transport is not None
        self.transport.closeStdin()

    def kill(self) -> None:
        """SIGKILL the process if it is still running."""
        if self.transport is not None and self.alive:
            try:
                self.transport.signalProcess("KILL")
            except ProcessExitedAlready:
                pass

    # -- sending -----------------------------------------------------------------------

    def write(self, message: dict[str, object]) -> None:
        """Write one message as a line; raise ``ProcessGone`` or ``ValueError`` (too long)."""
        if not self.writable:
            raise ProcessGone("proxy process is not running", self.exitInfo)
        line = encode(message)
        if len(line) > MAX_LINE + 1:
            raise ValueError(f"{message.get('method')} message over {MAX_LINE} bytes")
        assert self.transport is not None
        self.transport.write(line)

    def send(self, method: str, params: object, timeout: float) -> Deferred[object]:
        """Send a request; fire with its result, or fail after ``timeout`` seconds."""
        if not self.writable:
            return fail(ProcessGone("proxy process is not running", self.exitInfo))
        id = self.ids.next
        try:
            self.write(request(id, method, params))
        except Exception:
            return fail()
        self.ids.next += 1

        def cancel(d: Deferred[object]) -> None:
            p = self.pending.pop(id, None)
            if p is not None:
                p.timer.cancel()
                self.timedOut.add(id)

        def expire() -> None:
            p = self.pending.pop(id, None)
            if p is not None:
                self.timedOut.add(id)
                p.deferred.errback(RequestTimeout(method, timeout, id))

        d: Deferred[object] = Deferred(cancel)
        self.pending[id] = _Pending(method, d, self.clock.callLater(timeout, expire))
        return d

    def failPending(self, reason: Callable[[], Exception]) -> None:
        """Fail every request still awaiting an answer, each with a new ``reason()``."""
        pending, self.pending = self.pending, {}
        for p in pending.values():
            p.timer.cancel()
            p.deferred.errback(reason())

    # -- receiving ---------------------------------------------------------------------

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        if childFD == 1:
            self._stdout.dataReceived(data)
        elif childFD == 2:
            self._stderr.dataReceived(data)

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

    def lineReceived(self, line: bytes) -> None:
        """Handle one stdout line: a notification, a response, or a protocol error."""
        owner = self.owner
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            owner._protocolError(f"stdout line is not JSON: {line[:80]!r}")
            return
        if not isinstance(message, dict):
            owner._protocolError(f"stdout line is not a JSON object: {line[:80]!r}")
            return
        if message.get("jsonrpc") != "2.0":
            owner._protocolError(f"not JSON-RPC 2.0: {line[:80]!r}")
            return
        if "method" in message:
            method = message["method"]
            if not isinstance(method, str) or "result" in message or "error" in message:
                owner._protocolError(f"not JSON-RPC 2.0: {line[:80]!r}")
            elif "id" in message:
                owner._protocolError(f"unexpected request from the proxy: {method}")
                if self.writable:
                    self.write(error(message["id"], METHOD_NOT_FOUND, "method not found"))
            else:
                owner._dispatch(method, message.get("params"))
            return
        if "id" not in message:
            owner._protocolError(f"not JSON-RPC 2.0: {line[:80]!r}")
            return
        self._responseReceived(message)

    def _responseReceived(self, message: dict[str, object]) -> None:
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
        if type(id) is not int or id not in self.pending:
            if type(id) is int and id in self.timedOut:
                self.timedOut.discard(id)
                self.owner._lateResponse()
            elif type(id) is int and self.firstId <= id < self.ids.next:
                self.owner._protocolError(f"duplicate response to id {id}")
            else:
                self.owner._protocolError(f"response to unknown id {id!r}")
            return
        pending = self.pending.pop(id)
        pending.timer.cancel()
        if problem is not None:
            description = f"response to id {id} ({pending.method}) {problem}"
            self.owner._protocolError(description)
            pending.deferred.errback(ProtocolError(description))
        elif isinstance(err, dict):
            code, text = err["code"], err["message"]
            pending.deferred.errback(JSONRPCError(code, text, err.get("data")))
        else:
            pending.deferred.callback(message["result"])

    def processEnded(self, reason: Failure) -> None:
        if self._stderr.pendingBytes():
            self._stderr.dataReceived(b"\n")
        if self._stdout.pendingBytes():
            self.owner._protocolError(
                f"unterminated stdout line at exit ({self._stdout.pendingBytes()} bytes)"
            )
        self.exitInfo = ExitInfo.fromFailure(reason)
        self.state = ChannelState.ENDED
        self.owner._processEnded(self, self.exitInfo)
        waiters, self._exitWaiters = self._exitWaiters, []
        for d in waiters:
            d.callback(self.exitInfo)
