"""The messages to an enabled facade: ``<engine>:set-port``, pin, local
backend, discovery, plus the process-wide ``log/set-level`` and ``node/set-priority``; and
``Facade.watch``, which tells an attempt when discovery drops its node."""

from __future__ import annotations

import os

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.engines import OLLAMA
from tests.facade.facadekit import FacadeCase


class FacadeTests(FacadeCase):
    """``<engine>:set-port`` and the other messages through ``ProxyService.handle``."""

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
