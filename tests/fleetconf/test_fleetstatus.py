"""The fleet file in ``/status``, on the page and in ``/metrics`` (spec §11, §13)."""

from __future__ import annotations

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.facade.reload import ReloadResult, findReloader
from nvpair.proxy.ops.history import Window
from nvpair.proxy.ops.page import renderPage
from nvpair.proxy.ops.server import historyDocument, statusDocument
from nvpair.proxy.service import ProxyService
from tests.fleetconf.filekit import FleetFile
from tests.ops.opskit import makeService
from tests.support.dom import parseDom

FLEET = (
    '[[backend]]\nengine = "llamacpp"\nurl = "http://10.0.0.1:8081"\nname = "gpu-box"\n'
    "max_concurrency = 4\n"
    '[[backend]]\nengine = "llamacpp"\nurl = "http://10.0.0.2:8081"\nenabled = false\n'
)


class FleetStatusTests(SynchronousTestCase):
    """What an operator sees of the fleet file."""

    def setUp(self) -> None:
        self.file = FleetFile(self, FLEET)
        self.reactor = MemoryReactorClock()
        self.reactor.advance(1000)
        self.service: ProxyService = makeService(
            self.reactor, "--standalone", "--ops-port", "0", "--fleet", self.file.path
        )
        self.service.startService()
        self.addCleanup(self.service.stopService)

    def test_status(self) -> None:
        """``fleet`` says the file, generation, load time and backends; nodes have names."""
        doc = statusDocument(self.service)
        fleet = doc["fleet"]
        assert fleet is not None
        self.assertEqual(fleet["file"], self.file.path)
        self.assertEqual((fleet["generation"], fleet["loadedAt"]), (1, 1000000))
        self.assertEqual(fleet["engines"], ["llamacpp"])
        self.assertEqual(
            fleet["backends"][0],
            {
                "engine": "llamacpp",
                "url": "http://10.0.0.1:8081",
                "name": "gpu-box",
                "maxConcurrency": 4,
                "enabled": True,
            },
        )
        self.assertFalse(fleet["backends"][1]["enabled"])
        self.assertIsNone(fleet["error"])
        nodes = doc["facades"]["llamacpp"]["nodes"]
        self.assertEqual(
            [(n["id"], n["name"]) for n in nodes], [("http://10.0.0.1:8081", "gpu-box")]
        )

    def test_refusedShown(self) -> None:
        """A refused file is in ``/status`` and on the page with its line; counted."""
        self.file.write(FLEET + "colour = 1\n")
        reloader = findReloader(self.service)
        assert reloader is not None
        self.reactor.advance(5)
        self.assertEqual(reloader.reload("signal"), ReloadResult.INVALID)
        doc = statusDocument(self.service)
        fleet = doc["fleet"]
        assert fleet is not None
        self.assertEqual(
            fleet["error"],
            {
                "message": f"{self.file.path}:10: unknown key 'colour' in [[backend]] "
                "(allowed: engine, url, name, max_concurrency, enabled, preload, unload_idle)",
                "line": 10,
                "at": 1005000,
            },
        )
        self.assertEqual(fleet["reloads"], {"applied": 0, "unchanged": 0, "invalid": 1})
        html = renderPage(doc, historyDocument(self.service), Window().document(0))
        chips = [c.textContent() for c in parseDom(html).all("span", class_="chip")]
        self.assertIn("fleet generation 1", chips)
        self.assertIn("fleet loaded 5 s ago", chips)
        refused = f"fleet file refused {self.file.path}:10: unknown key 'colour'"
        self.assertEqual([c for c in chips if c.startswith(refused)], [chips[3]])
        (name,) = parseDom(html).all("span", class_="nname")
        self.assertEqual(name.textContent(), "gpu-box")
        sample = self.service.metrics.registry.get_sample_value(
            "nvpair_proxy_fleet_reloads_total", {"result": "invalid"}
        )
        self.assertEqual(sample, 1.0)

    def test_noFleetFile(self) -> None:
        """Without ``--fleet`` the document says ``fleet: null`` and the page no chip."""
        service = makeService(MemoryReactorClock(), "--standalone", "--ops-port", "0")
        doc = statusDocument(service)
        self.assertIsNone(doc["fleet"])
        html = renderPage(doc, historyDocument(service), Window().document(0))
        self.assertNotIn("fleet generation", html)
