"""The broker channel: JSON-RPC 2.0 over stdin/stdout (protocol §2-§4).

Framing and validation live here; what each method does is the ``IMessageHandler``'s
business.  Bad input is answered or reported and never stops the process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IHalfCloseableProtocol, IPushProducer, ITransport
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.jsonrpc import resolveAddress as resolveAddress
from nvpair.proxy.interfaces import IBrokerSink, IMessageHandler

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

    def notify(self, method: str, params: dict[str, Any]) -> None:
        pass


# Notification bytes written while the broker is not keeping up with stdout, past the
# transport's own 64 KiB buffer; past this, notifications are dropped (and counted).
BACKLOG_LIMIT = 8 << 20


@implementer(IPushProducer)
class _Outflow:
    """Told by the stdout transport when the broker stops (and resumes) reading it."""

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
    """

    log = Logger()

    def __init__(
        self,
        handler: IMessageHandler,
        onClosed: Callable[[], None],
        backlogLimit: int = BACKLOG_LIMIT,
    ) -> None:
        super().__init__()
        self._handler = handler
        self._onClosed = onClosed
        self._closed = False
        self._backlogLimit = backlogLimit
        self._backlog: int | None = None  # bytes written since stdout stalled; None: flowing
        self._dropped = 0
        self.transport: ITransport | None = None

    def connectionMade(self) -> None:
        register = getattr(self.transport, "registerProducer", None)
        if register is not None:
            register(_Outflow(self), True)

    # -- output -----------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if self.transport is not None and not self._closed:
            self.transport.write(jsonrpc.encode(message))

    def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send one notification to the broker (or drop it, when stdout is backed up)."""
        if self.transport is None or self._closed:
            return
        if isinstance(params, jsonrpc.Prepared):
            line = params.line(method)
        else:
            line = jsonrpc.encode(jsonrpc.notification(method, params))
        backlog = self._backlog
        if backlog is not None:
            if backlog + len(line) > self._backlogLimit:
                self._dropped += 1
                return
            self._backlog = backlog + len(line)
        self.transport.write(line)

    def _stalled(self) -> None:
        if self._backlog is None:
            self._backlog = 0
            self.log.debug("broker-output-stalled")

    def _drained(self) -> None:
        self._backlog = None
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
        self._closeOnce()

    def writeConnectionLost(self) -> None:
        self._closeOnce()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._closeOnce()
        self._closed = True

    def _closeOnce(self) -> None:
        if not self._closedNotified:
            self._closedNotified = True
            self._onClosed()

    _closedNotified = False


_NOTIFICATION = object()


def _validId(value: object) -> bool:
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


def _safeMethod(method: str) -> str:
    """A method name fit for a report: bounded, printable."""
    cleaned = "".join(c if c.isprintable() else "?" for c in method[:80])
    return cleaned or "(empty)"
