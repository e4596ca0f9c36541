"""The broker-owned state a ``ProxyProcess`` records so that a restarted proxy gets it back.

What the broker told the proxy and the proxy cannot rediscover on its own (protocol §3-§5):
the enabled facades (with the port each ended up on), each engine's discovery nodes,
selected node and local backend, the node priority and the log level.  Successful requests
and sent notifications are recorded as they go; ``replayTo`` sends the latest of each to a
freshly started process, facades first.
"""

from __future__ import annotations

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from nvpair.proxy.broker.jsonrpc import notification, resolveAddress
from nvpair.supervisor.channel import JSONRPCError, ProxyChannel

# Per-engine state, in the order it is replayed.
_ENGINE_STATE = ("discovery:nodes", "node/select", "node/set-local-backend")
_DEFAULT_LEVEL: dict[str, object] = {"level": "info"}


@attrs.define
class _Sent:
    """One recorded message: a notification or an answered request, and its params."""

    notify: bool
    method: str
    params: object


async def answered(d: Deferred[object]) -> object:
    """Await a request; a JSON-RPC error answer counts as an answer."""
    try:
        return await d
    except JSONRPCError as e:
        return e


class ReplayState:
    """The latest broker-owned state sent through one ``ProxyProcess`` (which logs for it)."""

    def __init__(self, log: Logger) -> None:
        self._log = log
        self._facades: dict[str, dict[str, object]] = {}
        self._engineState: dict[str, dict[str, _Sent]] = {}
        self._priority: _Sent | None = None
        self._logLevel: _Sent | None = None

    @property
    def logLevel(self) -> object:
        """The params of the last ``log/set-level`` (the default level before any)."""
        return self._logLevel.params if self._logLevel is not None else _DEFAULT_LEVEL

    def recordNotification(self, method: str, params: object) -> None:
        """Record a notification sent to the proxy (state-setting ones are kept)."""
        self._recordSent(_Sent(True, method, params))

    def recordAnswer(self, method: str, params: object, value: object) -> None:
        """Record a request the proxy answered successfully with ``value``."""
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
        addressed, name = resolveAddress(method)
        if addressed is not None and name == "set-port":
            if addressed in self._facades and isinstance(port, int):
                self._facades[addressed]["port"] = port
            return
        self._recordSent(_Sent(False, method, params))

    def _recordSent(self, sent: _Sent) -> None:
        addressed, name = resolveAddress(sent.method)
        if addressed is not None and name in _ENGINE_STATE:
            self._engineState.setdefault(addressed, {})[name] = sent
        elif sent.method == "node/set-priority":
            self._priority = sent
        elif sent.method == "log/set-level":
            self._logLevel = sent

    async def replayTo(self, proto: ProxyChannel, timeout: float) -> None:
        """Send the recorded state to a new process; a refused message is logged, not fatal."""
        for engine, params in list(self._facades.items()):
            answer = await answered(proto.send("facade/enable", params, timeout))
            if isinstance(answer, JSONRPCError):
                self._log.warn(
                    "replayed facade/enable for {engine} failed: {code} {message}",
                    engine=engine,
                    code=answer.code,
                    message=answer.message,
                )
            else:
                self.recordAnswer("facade/enable", params, answer)
        sent: list[_Sent] = []
        for state in self._engineState.values():
            sent.extend(state[name] for name in _ENGINE_STATE if name in state)
        sent.extend(s for s in (self._priority, self._logLevel) if s is not None)
        for s in sent:
            if s.notify:
                proto.write(notification(s.method, s.params))
            else:
                answer = await answered(proto.send(s.method, s.params, timeout))
                if isinstance(answer, JSONRPCError):
                    self._log.warn(
                        "replayed {method} failed: {code} {message}",
                        method=s.method,
                        code=answer.code,
                        message=answer.message,
                    )
