"""``facade/enable`` (protocol §4, §7, §8) on a memory reactor: binding, bind failures,
aliases, the persisted port, and the facade's life with the process."""

from __future__ import annotations

import errno
import os
from typing import Any

from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from zope.interface.verify import verifyObject

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.engines import LLAMACPP, OLLAMA
from nvpair.proxy.facade.facade import FacadeState
from nvpair.proxy.facade.standalone import IStandaloneProcess
from nvpair.proxy.interfaces import IMessageHandler, IRequestContext
from tests.facade.facadekit import FacadeCase, Port


class FacadeTests(FacadeCase):
    """``facade/enable`` through ``ProxyService.handle``."""

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

    def test_bindReason(self) -> None:
        """The reason of a bind failure is the operating system's text."""
        from nvpair.proxy.facade.facade import BindError, _reason

        err = CannotListenError("", 1, OSError(errno.EADDRINUSE, "Address already in use"))
        self.assertEqual(_reason(err), "Address already in use")
        self.assertEqual(str(BindError(1, "x")), "cannot listen on port 1: x")
