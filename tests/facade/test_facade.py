"""Facade enable / set-port rules (protocol §4, §7, §8) on a memory reactor."""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Any

from twisted.internet.address import IPv6Address
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.channel import Reply, RPCError
from nvpair.proxy.engines import LLAMACPP, OLLAMA
from nvpair.proxy.facade.facade import FacadeState
from nvpair.proxy.facade.standalone import IStandaloneProcess
from nvpair.proxy.interfaces import IMessageHandler, IRequestContext
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService
from tests.support.fakeupstream import ListSink


@implementer(IListeningPort)
class Port:
    """A fake listening port that remembers whether it was closed."""

    def __init__(self, reactor: BusyReactor, port: int, interface: str) -> None:
        self.reactor = reactor
        self.port = port
        self.interface = interface
        self.closed = False

    def startListening(self) -> None:
        pass

    def stopListening(self) -> None:
        self.closed = True
        self.reactor.open.discard((self.interface, self.port))

    def getHost(self) -> IPv6Address:
        return IPv6Address("TCP", self.interface, self.port)


class BusyReactor(MemoryReactorClock):
    """A memory reactor whose listenTCP fails on ports marked busy."""

    def __init__(self) -> None:
        super().__init__()
        self.busy: set[int] = set()
        self.open: set[tuple[str, int]] = set()
        self.ports: list[Port] = []

    def listenTCP(
        self, port: int, factory: ServerFactory, backlog: int = 50, interface: str = ""
    ) -> Port:
        if port in self.busy or (interface, port) in self.open:
            raise CannotListenError(
                interface, port, OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
            )
        self.tcpServers.append((port, factory, backlog, interface))
        p = Port(self, port, interface)
        self.open.add((interface, port))
        self.ports.append(p)
        return p


class FacadeTests(SynchronousTestCase):
    """``facade/enable`` and ``<engine>:set-port`` through ``ProxyService.handle``."""

    def setUp(self) -> None:
        self.stateDir = tempfile.mkdtemp(prefix="nvpair-facade-")
        options = Options({})
        options.parseOptions(["--state-dir", self.stateDir])
        assert options.settings is not None
        self.reactor = BusyReactor()
        self.service = ProxyService(options.settings, self.reactor)
        self.sink = ListSink()
        self.service.sink = self.sink

    def call(self, engine: str | None, name: str, params: dict[str, Any]) -> Any:
        """Handle a message the way the channel does: answer, then run ``after``."""
        outcome = self.service.handlers.handle(engine, name, params)
        if isinstance(outcome, Reply):
            self.sink.sent.append(("<result>", outcome.value))  # type: ignore[arg-type]
            outcome.after()
            return outcome.value
        return outcome

    def error(self, engine: str | None, name: str, params: dict[str, Any]) -> RPCError:
        with self.assertRaises(RPCError) as cm:
            self.call(engine, name, params)
        e: RPCError = cm.exception
        return e

    def listening(self) -> list[int]:
        return sorted(port for _, port in self.reactor.open)

    def test_interfaces(self) -> None:
        """The process is the facade host of the handlers and of standalone mode; the
        handlers are the broker channel's; the context is every request's."""
        self.assertTrue(verifyObject(IStandaloneProcess, self.service))
        self.assertTrue(verifyObject(IMessageHandler, self.service.handlers))
        self.assertTrue(verifyObject(IRequestContext, self.service.context))
        self.assertTrue(verifyObject(IListeningPort, Port(self.reactor, 1, "")))

    def test_facadeStates(self) -> None:
        """A facade listens once enabled and is stopped with the process."""
        self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        facade = self.service.facades["ollama"]
        self.assertIs(facade.state, FacadeState.LISTENING)
        self.service.startService()
        self.successResultOf(self.service.stopService())
        self.assertIs(facade.state, FacadeState.STOPPED)
        self.assertEqual(self.listening(), [])

    def test_enable(self) -> None:
        """The result, then ``discovery:subscribe`` and ``ready``, in that order."""
        result = self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.assertEqual(result, {"engine": "ollama", "port": 5000, "aliases": []})
        self.assertEqual(
            self.sink.sent,
            [
                ("<result>", result),
                ("ollama:discovery:subscribe", {}),
                ("ollama:ready", {"port": 5000, "aliases": []}),
            ],
        )
        self.assertEqual(self.reactor.ports[0].interface, "::")

    def test_enableAgain(self) -> None:
        """Enabling again returns the current binding, binds nothing and sends no ready."""
        self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.sink.sent.clear()
        result = self.service.handlers.handle(
            None, "facade/enable", {"engine": "ollama", "port": 6000}
        )
        self.assertEqual(result, {"engine": "ollama", "port": 5000, "aliases": []})
        self.assertEqual(self.sink.sent, [])
        self.assertEqual(self.listening(), [5000])

    def test_portZero(self) -> None:
        """Port 0 is the engine's standalone default."""
        result = self.call(None, "facade/enable", {"engine": "llamacpp", "port": 0})
        self.assertEqual(result["port"], LLAMACPP.standalonePort)

    def test_invalidParams(self) -> None:
        """Unknown engine, missing or invalid port, bad aliases: -32602 and nothing bound."""
        cases: list[dict[str, Any]] = [
            {"engine": "vllm", "port": 1},
            {"port": 1},
            {"engine": "ollama"},
            {"engine": "ollama", "port": -1},
            {"engine": "ollama", "port": 65536},
            {"engine": "ollama", "port": "80"},
            {"engine": "ollama", "port": 8.5},
            {"engine": "ollama", "port": True},
            {"engine": "ollama", "port": 1, "aliases": "127.0.0.1:2"},
            {"engine": "ollama", "port": 1, "aliases": ["10.0.0.1:2"]},
            {"engine": "ollama", "port": 1, "aliases": ["127.0.0.1:0"]},
            {"engine": "ollama", "port": 1, "ignorePersistedPort": "yes"},
        ]
        for params in cases:
            self.assertEqual(
                self.error(None, "facade/enable", params).code, jsonrpc.INVALID_PARAMS, params
            )
        self.assertEqual(self.reactor.tcpServers, [])
        self.assertEqual(self.sink.sent, [])

    def test_bindFailure(self) -> None:
        """A bind failure is -32010 with {engine, port, reason} plus ``<engine>:error``."""
        self.reactor.busy.add(5000)
        e = self.error(None, "facade/enable", {"engine": "lmstudio", "port": 5000})
        self.assertEqual(e.code, jsonrpc.BIND_FAILED)
        self.assertEqual(
            e.data, {"engine": "lmstudio", "port": 5000, "reason": os.strerror(errno.EADDRINUSE)}
        )
        self.assertEqual(
            self.sink.sent, [("lmstudio:error", {"kind": "bind", "port": 5000, "message": str(e)})]
        )
        self.assertNotIn("lmstudio", self.service.facades)
        self.reactor.busy.clear()
        self.assertEqual(
            self.call(None, "facade/enable", {"engine": "lmstudio", "port": 5000})["port"], 5000
        )

    def test_bindFailureConfined(self) -> None:
        """One engine's bind failure leaves another engine's listener alone."""
        self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.reactor.busy.add(6000)
        self.error(None, "facade/enable", {"engine": "llamacpp", "port": 6000})
        self.assertEqual(self.listening(), [5000])
        self.assertIn("ollama", self.service.facades)

    def test_aliases(self) -> None:
        """Aliases bind on loopback; an occupied one is reported and the primary is unaffected."""
        self.reactor.busy.add(7001)
        result = self.call(
            None,
            "facade/enable",
            {"engine": "ollama", "port": 5000, "aliases": ["127.0.0.1:7000", "127.0.0.1:7001"]},
        )
        self.assertEqual(result["aliases"], ["127.0.0.1:7000"])
        interfaces = {p.port: p.interface for p in self.reactor.ports}
        self.assertEqual(interfaces[7000], "127.0.0.1")
        methods = [m for m, _ in self.sink.sent]
        self.assertEqual(
            methods,
            ["ollama:errors:report", "<result>", "ollama:discovery:subscribe", "ollama:ready"],
        )
        self.assertEqual(self.sink.sent[0][1]["kind"], "alias")
        self.assertIn("127.0.0.1:7001", self.sink.sent[0][1]["message"])
        self.assertEqual(self.sink.sent[-1][1], {"port": 5000, "aliases": ["127.0.0.1:7000"]})

    def test_setPort(self) -> None:
        """set-port binds the new port before closing the old, persists, answers, then ready."""
        self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        old = self.reactor.ports[0]
        self.sink.sent.clear()
        result = self.call("ollama", "set-port", {"port": 5001})
        self.assertEqual(result, {"port": 5001})
        self.assertTrue(old.closed)
        self.assertEqual(self.listening(), [5001])
        self.assertEqual(
            self.sink.sent,
            [("<result>", {"port": 5001}), ("ollama:ready", {"port": 5001, "aliases": []})],
        )
        self.assertEqual(self.service.ports.load(OLLAMA), 5001)
        self.assertEqual(os.listdir(self.stateDir), ["proxy-port.json"])

    def test_setPortFailureKeepsOld(self) -> None:
        """A failed set-port keeps the old listener, persists nothing, and reports the bind."""
        self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.sink.sent.clear()
        self.reactor.busy.add(5001)
        e = self.error("ollama", "set-port", {"port": 5001})
        self.assertEqual(e.code, jsonrpc.BIND_FAILED)
        self.assertEqual(e.data["engine"], "ollama")  # type: ignore[index]
        self.assertEqual(self.listening(), [5000])
        self.assertFalse(self.reactor.ports[0].closed)
        self.assertEqual([m for m, _ in self.sink.sent], ["ollama:error"])
        self.assertIsNone(self.service.ports.load(OLLAMA))
        self.assertEqual(self.service.facades["ollama"].port, 5000)

    def test_setPortInvalid(self) -> None:
        """An out-of-range set-port is -32602 and binds nothing; port 0 is the default."""
        self.call(None, "facade/enable", {"engine": "llamacpp", "port": 5000})
        for bad in (-5, 70000, "1", None):
            self.assertEqual(
                self.error("llamacpp", "set-port", {"port": bad}).code, jsonrpc.INVALID_PARAMS
            )
        self.assertEqual(self.listening(), [5000])
        self.assertEqual(self.call("llamacpp", "set-port", {"port": 0}), {"port": 8080})

    def test_setPortNotEnabled(self) -> None:
        """set-port to an engine whose facade is not enabled is -32004."""
        e = self.error("lmstudio", "set-port", {"port": 5})
        self.assertEqual((e.code, e.message), (jsonrpc.FACADE_NOT_ENABLED, "facade not enabled"))

    def test_unknownMethods(self) -> None:
        """Unknown names, addressed or not, are -32601."""
        self.assertEqual(self.error(None, "nope", {}).code, jsonrpc.METHOD_NOT_FOUND)
        self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.assertEqual(self.error("ollama", "nope", {}).code, jsonrpc.METHOD_NOT_FOUND)

    def test_persistedPortWins(self) -> None:
        """A persisted port replaces the requested one unless ``ignorePersistedPort``."""
        self.service.ports.save(OLLAMA, 5555)
        self.service.ports.save(LLAMACPP, 6666)
        self.assertEqual(
            self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})["port"], 5555
        )
        self.assertEqual(
            self.call(
                None,
                "facade/enable",
                {"engine": "llamacpp", "port": 6000, "ignorePersistedPort": True},
            )["port"],
            6000,
        )

    def test_persistedPortBusyFallsBack(self) -> None:
        """A persisted port that cannot be re-listened is reported (kind listen) and the
        requested port is used; the file is kept for the next start."""
        self.service.ports.save(OLLAMA, 5555)
        self.reactor.busy.add(5555)
        result = self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.assertEqual(result["port"], 5000)
        reports = [p for m, p in self.sink.sent if m == "ollama:errors:report"]
        self.assertEqual([r["kind"] for r in reports], ["listen"])
        self.assertIn("5555", reports[0]["message"])
        self.assertEqual(self.service.ports.load(OLLAMA), 5555)
        self.assertIn(("ollama:ready", {"port": 5000, "aliases": []}), self.sink.sent)

    def test_persistedAndRequestedBusy(self) -> None:
        """When neither the persisted nor the requested port binds, the answer is the bind
        failure of the requested port and nothing stays bound."""
        self.service.ports.save(OLLAMA, 5555)
        self.reactor.busy.update({5555, 5000})
        e = self.error(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.assertEqual(e.code, -32010)
        assert isinstance(e.data, dict)
        self.assertEqual(e.data["port"], 5000)
        self.assertEqual(self.service.facades, {})

    def test_corruptPortFile(self) -> None:
        """An invalid port file is reported (kind state) and the requested port is used."""
        with open(os.path.join(self.stateDir, "proxy-port.json"), "w") as f:
            f.write("{nope")
        result = self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        self.assertEqual(result["port"], 5000)
        self.assertEqual(self.sink.sent[0][0], "ollama:errors:report")
        self.assertEqual(self.sink.sent[0][1]["kind"], "state")

    def test_selectAndBackend(self) -> None:
        """Pin and local backend messages update the facade; bad values are -32602."""
        self.call(None, "facade/enable", {"engine": "ollama", "port": 5000})
        facade = self.service.facades["ollama"]
        self.call("ollama", "node/select", {"nodeId": "A"})
        self.assertEqual(facade.pin, "A")
        self.call("ollama", "node/select", {"nodeId": None})
        self.assertIsNone(facade.pin)
        self.call("ollama", "node/set-local-backend", {"url": "http://127.0.0.1:11435/"})
        self.assertEqual(facade.localBackend, "http://127.0.0.1:11435")
        self.assertEqual(self.error("ollama", "node/select", {"nodeId": 5}).code, -32602)
        self.assertEqual(
            self.error("ollama", "node/set-local-backend", {"url": "ftp://x"}).code, -32602
        )
        self.assertEqual(self.error("ollama", "discovery:nodes", {"nodes": "x"}).code, -32602)
        self.call(
            "ollama",
            "discovery:nodes",
            {
                "nodes": [
                    {
                        "id": "A",
                        "self": False,
                        "addresses": ["http://127.0.0.1:1"],
                        "models": ["m"],
                        "extra": True,
                    }
                ]
            },
        )
        self.assertIn("A", facade.snapshot)

    def test_setLevel(self) -> None:
        """``log/set-level`` switches the level; an unknown level is -32602."""
        self.assertEqual(self.call(None, "log/set-level", {"level": "debug"}), {"level": "debug"})
        self.assertTrue(self.service.logControl.enabled("debug"))
        self.call(None, "log/set-level", {"level": "WARNING"})
        self.assertEqual(self.service.logControl.level, "warn")
        self.assertEqual(self.error(None, "log/set-level", {"level": "loud"}).code, -32602)
        self.assertEqual(self.error(None, "log/set-level", {}).code, -32602)

    def test_priority(self) -> None:
        """``node/set-priority`` is accepted unaddressed; malformed params are -32602."""
        self.call(
            None,
            "node/set-priority",
            {"generation": 1, "order": ["A"], "load": {"A": {"pending": 1, "gpuPressure": 0}}},
        )
        self.assertEqual(self.error(None, "node/set-priority", {"generation": "x"}).code, -32602)

    def test_bindReason(self) -> None:
        """The reason of a bind failure is the operating system's text."""
        from nvpair.proxy.facade.facade import BindError, _reason

        err = CannotListenError("", 1, OSError(errno.EADDRINUSE, "Address already in use"))
        self.assertEqual(_reason(err), "Address already in use")
        self.assertEqual(str(BindError(1, "x")), "cannot listen on port 1: x")


class _Watcher:
    """Records when its node left discovery."""

    def __init__(self) -> None:
        self.calls = 0

    def left(self) -> None:
        self.calls += 1


class WatchTests(SynchronousTestCase):
    """Facade.watch tells an attempt when its node leaves discovery, until unwatched."""

    def setUp(self) -> None:
        from tests.support.fakeupstream import makeFacade, node

        self.node = node
        self.facade = makeFacade(MemoryReactorClock(), [node("A"), node("B")])

    def test_leftOnceWhenTheNodeLeaves(self) -> None:
        """Watchers of a node that leaves are told once; watchers of staying nodes are not."""
        from tests.support.fakeupstream import setNodes

        a1, a2, b = _Watcher(), _Watcher(), _Watcher()
        self.facade.watch("A", a1)
        self.facade.watch("A", a2)
        self.facade.watch("B", b)
        setNodes(self.facade, [self.node("B")])
        self.assertEqual((a1.calls, a2.calls, b.calls), (1, 1, 0))
        setNodes(self.facade, [])
        self.assertEqual((a1.calls, a2.calls, b.calls), (1, 1, 1))
        self.assertEqual(self.facade._watchers, {})

    def test_unwatch(self) -> None:
        """An unwatched watcher is not told, unwatching twice is harmless, and the last
        unwatch of a node forgets it."""
        from tests.support.fakeupstream import setNodes

        a1, a2 = _Watcher(), _Watcher()
        self.facade.watch("A", a1)
        self.facade.watch("A", a2)
        self.facade.unwatch("A", a1)
        self.facade.unwatch("A", a1)
        self.facade.unwatch("Z", a1)
        self.assertEqual(list(self.facade._watchers["A"]), [a2])
        self.facade.unwatch("A", a2)
        self.assertNotIn("A", self.facade._watchers)
        setNodes(self.facade, [])
        self.assertEqual((a1.calls, a2.calls), (0, 0))
