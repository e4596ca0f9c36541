"""What each broker message does (protocol §4): the method table behind the broker channel.

The channel frames and validates; ``BrokerHandlers`` finds the method, checks its params
and acts on the process: it enables facades through the ``IFacadeHost`` (the process
itself, which owns listeners), and changes discovery, pins, local backends, the scheduler's
priority and the log level directly.  Every message is counted by name and error code.

It sits beside ``service``, above the packages it drives (facade, routing, ops), rather
than in ``broker``: dispatch reports workloads through ``broker``, so ``broker`` must not
import what imports dispatch.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger
from zope.interface import implementer

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.channel import Reply, RPCError
from nvpair.proxy.engines import ENGINES, Engine
from nvpair.proxy.facade.facade import BindError, Facade, IFacadeHost, parseAlias
from nvpair.proxy.facade.ports import PortError, PortStore, requestedPort
from nvpair.proxy.interfaces import IBrokerSink, IMessageHandler
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.nodes import parseNodes
from nvpair.proxy.routing.reservations import ReservationMap, parsePriority
from nvpair.proxy.runtime.logs import LogControl
from nvpair.proxy.settings import LEVELS

Params = dict[str, object]


def _notFound() -> RPCError:
    return RPCError(jsonrpc.METHOD_NOT_FOUND, "method not found")


@implementer(IMessageHandler)
class BrokerHandlers:
    """Handles every well-formed broker message for one process."""

    log = Logger()

    def __init__(
        self,
        host: IFacadeHost,
        ports: PortStore,
        sink: IBrokerSink,
        metrics: Metrics,
        reservations: ReservationMap,
        logControl: LogControl,
    ) -> None:
        self.host = host
        self.ports = ports
        self.sink = sink
        self.metrics = metrics
        self.reservations = reservations
        self.logControl = logControl

    def handle(self, engine: str | None, name: str, params: Params) -> object:
        """Dispatch one broker message (protocol §4), counting it and any error answer."""
        try:
            result = self._route(engine, name, params)
        except RPCError as e:
            self.metrics.rpcMessage(name, e.code)
            raise
        except Exception:
            self.metrics.rpcMessage(name, jsonrpc.INTERNAL_ERROR)
            raise
        self.metrics.rpcMessage(name)
        return result

    def _route(self, engine: str | None, name: str, params: Params) -> object:
        if engine is None:
            handler = _PROCESS.get(name)
            if handler is None:
                raise _notFound()
            return handler(self, params)
        facadeHandler = _FACADE.get(name)
        if facadeHandler is None:
            raise _notFound()
        facade = self.host.facades.get(engine)
        if facade is None:
            raise RPCError(jsonrpc.FACADE_NOT_ENABLED, "facade not enabled")
        return facadeHandler(self, facade, params)

    def ready(self, facade: Facade) -> None:
        """Announce ``<engine>:ready`` with the facade's port and aliases."""
        self.sink.notify(
            f"{facade.engine.id}:ready", {"port": facade.port, "aliases": list(facade.aliases)}
        )

    # -- unaddressed ----------------------------------------------------------------------

    def enable(self, params: Params) -> object:
        """``facade/enable``: enable (or report) an engine's facade, then ``ready``."""
        engineId = params.get("engine")
        if not isinstance(engineId, str) or engineId not in ENGINES:
            raise RPCError(jsonrpc.INVALID_PARAMS, "unknown engine")
        engine = ENGINES[engineId]
        existing = self.host.facades.get(engineId)
        if existing is not None:
            return {"engine": engineId, "port": existing.port, "aliases": list(existing.aliases)}
        if "port" not in params:
            raise RPCError(jsonrpc.INVALID_PARAMS, "port is required")
        try:
            port = requestedPort(engine, params["port"])
        except PortError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        aliases = params.get("aliases") or []
        if not isinstance(aliases, list):
            raise RPCError(jsonrpc.INVALID_PARAMS, "aliases must be a list")
        try:
            for alias in aliases:
                parseAlias(alias)
        except ValueError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        ignore = params.get("ignorePersistedPort", False)
        if not isinstance(ignore, bool):
            raise RPCError(jsonrpc.INVALID_PARAMS, "ignorePersistedPort must be a boolean")
        try:
            facade = self.host.enableFacade(engine, port, aliases, ignore)
        except BindError as e:
            raise self._bindFailed(engine, e) from None
        result = {"engine": engineId, "port": facade.port, "aliases": list(facade.aliases)}

        def after() -> None:
            self.sink.notify(f"{engineId}:discovery:subscribe", {})
            self.ready(facade)

        return Reply(result, after)

    def _bindFailed(self, engine: Engine, e: BindError) -> RPCError:
        """Log and announce ``<engine>:error`` (kind bind); the error to answer with."""
        self.log.warn("bind-failed", engine=engine.id, port=e.port, reason=e.reason)
        self.sink.notify(f"{engine.id}:error", {"kind": "bind", "port": e.port, "message": str(e)})
        return RPCError(
            jsonrpc.BIND_FAILED, str(e), {"engine": engine.id, "port": e.port, "reason": e.reason}
        )

    def setPriority(self, params: Params) -> object:
        """``node/set-priority``: the scheduler's order and load, if newer than the last."""
        try:
            generation, order, load = parsePriority(params)
        except ValueError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        applied = self.reservations.applyPriority(generation, order, load)
        if self.logControl.enabled("debug"):
            self.log.debug("priority", generation=generation, applied=applied)
        return None

    def setLevel(self, params: Params) -> object:
        """``log/set-level``: debug, info, warn (or warning) or error."""
        level = params.get("level")
        if isinstance(level, str) and level.lower() == "warning":
            level = "warn"
        if not isinstance(level, str) or level.lower() not in LEVELS:
            raise RPCError(jsonrpc.INVALID_PARAMS, "level must be debug, info, warn or error")
        self.logControl.setLevel(level.lower())
        return {"level": level.lower()}

    # -- addressed to a facade ------------------------------------------------------------

    def setPort(self, facade: Facade, params: Params) -> object:
        """``<engine>:set-port``: move the primary listener, persist the port, ``ready``."""
        engine = facade.engine
        try:
            port = requestedPort(engine, params.get("port"))
        except PortError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        try:
            facade.move(port)
        except BindError as e:
            raise self._bindFailed(engine, e) from None
        try:
            self.ports.save(engine, port)
        except OSError as e:
            self.host.facadeProblem(engine.id, "state", f"cannot persist the port: {e.strerror}")
        self.log.info("facade-moved", engine=engine.id, port=port)
        return Reply({"port": port}, lambda: self.ready(facade))

    def discoveryNodes(self, facade: Facade, params: Params) -> object:
        """``<engine>:discovery:nodes``: replace the facade's discovery snapshot."""
        try:
            nodes = parseNodes(params)
        except ValueError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        facade.setSnapshot(Snapshot(nodes, facade.engine.normalize))
        if self.logControl.enabled("debug"):
            self.log.debug("discovery", engine=facade.engine.id, nodes=len(nodes))
        return None

    def select(self, facade: Facade, params: Params) -> object:
        """``<engine>:node/select``: pin a node (or unpin with null)."""
        nodeId = params.get("nodeId")
        if nodeId is not None and not isinstance(nodeId, str):
            raise RPCError(jsonrpc.INVALID_PARAMS, "nodeId must be a string or null")
        facade.pin = nodeId
        return None

    def localBackend(self, facade: Facade, params: Params) -> object:
        """``<engine>:node/set-local-backend``: where this node's own engine listens."""
        url = params.get("url")
        if not isinstance(url, str) or not url.startswith("http://") or len(url) <= 7:
            raise RPCError(jsonrpc.INVALID_PARAMS, "url must be an http:// URL")
        facade.setLocalBackend(url)
        return None


# The method tables: a name is handled only when it is exactly one of these keys.
_PROCESS: dict[str, Callable[[BrokerHandlers, Params], object]] = {
    "facade/enable": BrokerHandlers.enable,
    "node/set-priority": BrokerHandlers.setPriority,
    "log/set-level": BrokerHandlers.setLevel,
}
_FACADE: dict[str, Callable[[BrokerHandlers, Facade, Params], object]] = {
    "set-port": BrokerHandlers.setPort,
    "discovery:nodes": BrokerHandlers.discoveryNodes,
    "node/select": BrokerHandlers.select,
    "node/set-local-backend": BrokerHandlers.localBackend,
}
