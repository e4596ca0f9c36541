"""The broker channel: JSON-RPC 2.0 over stdin/stdout (protocol §2-§4).

Framing and validation live here; what each method does is the ``IMessageHandler``'s
business.  Bad input is answered or reported and never stops the process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from enum import Enum

from twisted.internet import defer
from twisted.internet.interfaces import (
    IHalfCloseableProtocol,
    IPullProducer,
    IPushProducer,
    ITransport,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.jsonrpc import resolveAddress
from nvpair.proxy.interfaces import IBrokerSink, IMessageHandler
from nvpair.proxy.runtime.eventloop import ITurnEnd

# Names that only make sense addressed to a facade (spec §4).
FACADE_SCOPED = frozenset(
    (
        "ready",
        "error",
        "set-port",
        "discovery:subscribe",
        "discovery:nodes",
        "node/select",
        "node/set-local-backend",
    )
)


class Reply:
    """A handler result plus work to do once the answer has been written (e.g. ``ready``)."""

    def __init__(self, value: object, after: Callable[[], None]) -> None:
        self.value = value
        self.after = after


class RPCError(Exception):
    """A JSON-RPC error answer: code, message and optional data."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def isFacadeScoped(name: str) -> bool:
    """Whether an unaddressed name is exactly one of the facade-scoped names (which then
    needs a facade address); any other unknown name is simply not found (``-32601``)."""
    return name in FACADE_SCOPED


@implementer(IBrokerSink)
class NullSink:
    """The sink of standalone mode: JSON-RPC output is not written (protocol §9)."""

    listening = False  # producers may skip building what would be sent

    def notify(self, method: str, params: dict[str, object]) -> None:
        pass


@implementer(IBrokerSink)
class SinkSwitch:
    """The sink every producer of notifications holds: it forwards to whichever sink the
    process uses now (nothing until it starts, the broker channel once it has one, the
    ``NullSink`` in standalone mode), so producers are built once, before that is known.
    ``listening`` is the target's, taken when it is set (read several times per request; a
    sink's own never changes)."""

    __slots__ = ("_target", "listening")

    def __init__(self, target: IBrokerSink) -> None:
        self.target = target

    @property
    def target(self) -> IBrokerSink:
        """The sink notifications go to now."""
        return self._target

    @target.setter
    def target(self, target: IBrokerSink) -> None:
        self._target = target
        self.listening: bool = target.listening

    def notify(self, method: str, params: dict[str, object]) -> None:
        self._target.notify(method, params)


# Notification bytes written while the broker is not keeping up with stdout, past the
# transport's own 64 KiB buffer; past this, notifications are dropped (and counted).
BACKLOG_LIMIT = 8 << 20


class ChannelState(Enum):
    """Where the channel is in its life."""

    OPEN = "open"
    """Reading the broker's messages and writing to it."""
    ENDED = "ended"
    """The broker closed its side: the process has been told (once); output still goes."""
    CLOSED = "closed"
    """The connection is gone: nothing more is written."""


class OutputFlow(Enum):
    """Whether the broker keeps up with stdout."""

    FLOWING = "flowing"
    """Notifications are written as they come."""
    STALLED = "stalled"
    """Stdout took less than was written: notifications are counted against the backlog
    limit until the transport has written everything."""


_OPEN = ChannelState.OPEN
_CLOSED = ChannelState.CLOSED
_STALLED = OutputFlow.STALLED


def writeSome(fd: int, data: bytes) -> int:
    """Write to the non-blocking ``fd`` what it takes of ``data`` now; the bytes written, 0
    when it takes nothing now or fails (the transport, handed the rest, sees the loss)."""
    try:
        return os.write(fd, data)
    except OSError:
        return 0


@implementer(IPushProducer, IPullProducer)
class _Outflow:
    """Told by the stdout transport when the broker stops reading it (as a push producer)
    and when it has written everything it was given (either way)."""

    def __init__(self, channel: BrokerChannel) -> None:
        self._channel = channel

    def pauseProducing(self) -> None:
        self._channel._stalled()

    def resumeProducing(self) -> None:
        self._channel._drained()

    def stopProducing(self) -> None:
        pass


@implementer(IBrokerSink, IHalfCloseableProtocol)
class BrokerChannel(jsonrpc.LineFramer):
    """Reads broker messages from stdin, answers on stdout, emits notifications.

    Should the broker stop reading stdout, notifications keep being written (Twisted
    buffers them) up to ``BACKLOG_LIMIT`` bytes; beyond that they are dropped and counted
    rather than held without bound, and one ``errors:report`` (kind ``overflow``) says how
    many once the broker has read everything.  Responses to requests are always written.

    Given a ``turnEnd`` (the process's reactor), the lines of one reactor turn, answers and
    notifications in the order they came, go to stdout in one write at the end of the turn;
    without one, each line is written at once.  Given also ``output`` (what writes to
    stdout's descriptor without blocking, ``writeSome``), a turn's lines go straight to the
    descriptor while the transport holds nothing: the pipe writer's bookkeeping (four
    ``epoll_ctl`` calls and a dozen Python calls a write) is paid only when the pipe is full.
    What the descriptor does not take goes to the transport, the output counts as stalled,
    and it goes through the transport until it has written everything (it is registered as
    a pull producer, told each time its buffer empties).
    """

    log = Logger()
    listening = True  # the broker reads every notification (backlog limits aside)

    def __init__(
        self,
        handler: IMessageHandler,
        onClosed: Callable[[], None],
        backlogLimit: int = BACKLOG_LIMIT,
        turnEnd: ITurnEnd | None = None,
        output: Callable[[bytes], int] | None = None,
    ) -> None:
        super().__init__()
        self._handler = handler
        self._onClosed = onClosed
        self.state = ChannelState.OPEN
        self.flow = OutputFlow.FLOWING
        self._backlogLimit = backlogLimit
        self._backlog = 0  # bytes written since stdout stalled
        self._dropped = 0
        self.transport: ITransport | None = None
        self._turnEnd = turnEnd
        self._turn: list[bytes] = []  # this turn's lines, written when it ends
        self._output = output if turnEnd is not None else None

    def connectionMade(self) -> None:
        register = getattr(self.transport, "registerProducer", None)
        if register is not None:
            register(_Outflow(self), self._output is None)

    # -- output -----------------------------------------------------------------------

    def _write(self, line: bytes) -> None:
        """Write ``line`` now, or (given a ``turnEnd``) with the rest of this turn's."""
        turn = self._turn
        if self._turnEnd is None:
            if self.transport is not None:
                self.transport.write(line)
            return
        if not turn:
            self._turnEnd.callAtTurnEnd(self._endTurn)
        turn.append(line)

    def _endTurn(self) -> None:
        lines = b"".join(self._turn)
        self._turn.clear()
        if self.transport is None or self.state is _CLOSED:
            return
        output = self._output
        if output is not None and self.flow is not _STALLED:
            written = output(lines)
            if written >= len(lines):
                return
            lines = lines[written:]
            self._stalled()
        self.transport.write(lines)

    def _send(self, message: dict[str, object]) -> None:
        if self.transport is not None and self.state is not _CLOSED:
            self._write(jsonrpc.encode(message))

    def notify(self, method: str, params: dict[str, object]) -> None:
        """Send one notification to the broker (or drop it, when stdout is backed up)."""
        if self.transport is None or self.state is _CLOSED:
            return
        if isinstance(params, jsonrpc.Prepared):
            line = params.line(method)
        else:
            line = jsonrpc.encode(jsonrpc.notification(method, params))
        if self.flow is _STALLED:
            backlog = self._backlog + len(line)
            if backlog > self._backlogLimit:
                self._dropped += 1
                return
            self._backlog = backlog
        self._write(line)

    def _stalled(self) -> None:
        if self.flow is not _STALLED:
            self.flow = _STALLED
            self._backlog = 0
            self.log.debug("broker-output-stalled")

    def _drained(self) -> None:
        self.flow = OutputFlow.FLOWING
        dropped, self._dropped = self._dropped, 0
        if dropped:
            self.log.warn("broker-notifications-dropped", count=dropped)
            self.notify(
                "errors:report",
                {
                    "kind": "overflow",
                    "message": f"{dropped} notifications dropped while stdout was not read",
                },
            )

    def reportProtocol(self, message: str) -> None:
        """Report bad input with an unaddressed ``errors:report`` (kind protocol)."""
        self.log.warn("protocol-error", problem=message)
        self.notify("errors:report", {"kind": "protocol", "message": message})

    # -- input ------------------------------------------------------------------------

    def lineTooLong(self) -> None:
        self.reportProtocol(f"line over {self.maxLine} bytes dropped")

    def lineReceived(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self.reportProtocol("line is not valid JSON")
            return
        if not isinstance(message, dict):
            self.reportProtocol("message is not a JSON object")
            return
        hasId = "id" in message
        msgId = message.get("id")
        method = message.get("method")
        if not isinstance(method, str):
            if "result" in message or "error" in message:
                self.reportProtocol("unexpected response from the broker")
            else:
                self.reportProtocol("message has no method")
                if hasId and _validId(msgId):
                    self._send(jsonrpc.error(msgId, jsonrpc.INVALID_REQUEST, "invalid request"))
            return
        if hasId and not _validId(msgId):
            self.reportProtocol("request id must be a string, a number or null")
            return
        params = message.get("params", {})
        if params is None:
            params = {}
        self._dispatch(method, params, msgId if hasId else _NOTIFICATION)

    def _dispatch(self, method: str, params: object, msgId: object) -> None:
        try:
            if not isinstance(params, dict):
                raise RPCError(jsonrpc.INVALID_PARAMS, "params must be an object")
            engine, name = resolveAddress(method)
            if engine is None and isFacadeScoped(name):
                raise RPCError(jsonrpc.INVALID_PARAMS, "no facade addressed")
            outcome = self._handler.handle(engine, name, params)
        except RPCError as e:
            self._answerError(method, msgId, e)
            return
        except Exception:
            self.log.failure("broker-handler-crashed", method=method)
            self._answerError(method, msgId, RPCError(jsonrpc.INTERNAL_ERROR, "internal error"))
            return
        if isinstance(outcome, defer.Deferred):
            outcome.addCallbacks(
                lambda value: self._answer(msgId, value),
                lambda f: self._answerFailure(method, msgId, f),
            )
        else:
            self._answer(msgId, outcome)

    def _answer(self, msgId: object, value: object) -> None:
        after = None
        if isinstance(value, Reply):
            after = value.after
            value = value.value
        if msgId is not _NOTIFICATION:
            self._send(jsonrpc.result(msgId, value if value is not None else {}))
        if after is not None:
            after()

    def _answerFailure(self, method: str, msgId: object, failure: Failure) -> None:
        if isinstance(failure.value, RPCError):
            self._answerError(method, msgId, failure.value)
        else:
            self.log.failure("broker-handler-crashed", failure, method=method)
            self._answerError(method, msgId, RPCError(jsonrpc.INTERNAL_ERROR, "internal error"))

    def _answerError(self, method: str, msgId: object, e: RPCError) -> None:
        if msgId is _NOTIFICATION:
            self.reportProtocol(f"{_safeMethod(method)}: {e.message}")
        else:
            self._send(jsonrpc.error(msgId, e.code, e.message, e.data))

    # -- lifecycle ----------------------------------------------------------------------

    def readConnectionLost(self) -> None:
        self._end()

    def writeConnectionLost(self) -> None:
        self._end()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._end()
        self.state = _CLOSED

    def _end(self) -> None:
        """The broker is gone: tell the process, once."""
        if self.state is _OPEN:
            self.state = ChannelState.ENDED
            self._onClosed()


_NOTIFICATION = object()


def _validId(value: object) -> bool:
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


def _safeMethod(method: str) -> str:
    """A method name fit for a report: bounded, printable."""
    cleaned = "".join(c if c.isprintable() else "?" for c in method[:80])
    return cleaned or "(empty)"
