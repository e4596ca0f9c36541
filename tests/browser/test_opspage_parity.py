"""The script redraws the server's page: headless Chromium against a scripted ops service.

On a frozen clock, a scripted service (engine-provided markup in model names, node ids and
errors, an ``affinity`` object and a refused fleet file added to /status) is served from an
in-process site; Chromium runs the page's script, and what it drew must equal what the
server rendered, with the hostile markup kept as text.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.internet.address import IPv4Address
from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from nvpair.proxy.ops.documents import StatusDocument
from nvpair.proxy.ops.history import Window
from nvpair.proxy.ops.page import renderPage
from nvpair.proxy.ops.server import PAGE_CSP, historyDocument, opsResource, statusDocument
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.nodes import parseNodes
from nvpair.proxy.service import ProxyService
from tests.browser.chromium import NO_CHROMIUM, chromiumPath, runChromium
from tests.ops.opskit import ENGINE, makeService, scripted
from tests.support.dom import Element, parseDom

HOSTILE = "<img src=x onerror=alert(1)>"
ENGINE_STATE: dict[str, object] = {
    "state": "fresh",
    "slotsBusy": 1,
    "slotsTotal": 4,
    "loaded": ["m1"],
    "cacheHitRatio": 0.825,
}
AFFINITY: dict[str, object] = {
    "mode": "prefix",
    "active": True,
    "counts": {"llamacpp": {"hit": 3, "miss": 1}},
}


QUEUEING: dict[str, object] = {
    "queueMax": 256,
    "queueTimeoutSeconds": 30.0,
    "queues": {
        "llamacpp": {
            "m1": {"depth": 3, "oldestWaitSeconds": 1.5, "lastWaitSeconds": 0.25, "dispatched": 9},
            HOSTILE: {"depth": 0, "oldestWaitSeconds": 0, "lastWaitSeconds": 12.5, "dispatched": 1},
        }
    },
    "refused": {"llamacpp": {"queue_full": 2}},
    "held": {"now": 1, "endedWithRoom": 1234, "endedWithBudget": 5},
    "declaredClients": ["ide", HOSTILE],
    "clients": {
        "llamacpp": {
            "ide": {"waiting": 2, "dispatched": 1500, "refused": {}},
            HOSTILE: {"waiting": 0, "dispatched": 3, "refused": {"queue_full": 1}},
            "unverified": {"waiting": 1, "dispatched": 7, "refused": {"queue_full": 2}},
        }
    },
    "breakers": {
        HOSTILE: {"state": "open", "opens": 2, "cooldownSeconds": 2.0, "recentFailures": 0},
    },
}


def residency(first: str, second: str) -> dict[str, object]:
    """A ``residency`` object: a node holding five models (one loading, one hostile name),
    with loads and evictions seen; a node that holds none."""

    def model(name: str, state: str = "loaded") -> dict[str, object]:
        return {"model": name, "state": state, "running": 0, "loadSeconds": 3.0}

    held = [model("a"), model(HOSTILE, "loading"), model("c", "sleeping"), model("d"), model("e")]
    return {
        "defaultLoadSeconds": 10.0,
        "nodes": {
            first: {"fresh": True, "models": held, "loads": 3, "evictions": 1},
            second: {"fresh": True, "models": [], "loads": 0, "evictions": 0},
        },
        "actions": None,
    }


class _WithAffinity(Resource):
    """The ops resource of a scripted service, its page and /status given an ``affinity``
    object (as the affinity feature adds) so that both renderers draw that tile too."""

    isLeaf = True

    def __init__(self, service: ProxyService) -> None:
        super().__init__()
        self.service = service
        self.ops = opsResource(service)

    def status(self) -> StatusDocument:
        status = statusDocument(self.service)
        status["affinity"] = AFFINITY
        # A fleet file (standalone --fleet) with a refused edit, and a named node.
        status["fleet"] = {
            "file": "/etc/nvpair/fleet.toml",
            "generation": 3,
            "loadedAt": status["now"] - 125_000,
            "engines": ["llamacpp"],
            "keptEngines": [],
            "backends": [],
            "clients": [{"name": "ide", "weight": 2.0}],
            "error": {"message": f"fleet.toml:4: {HOSTILE}", "line": 4, "at": status["now"]},
            "reloads": {"applied": 2, "unchanged": 0, "invalid": 1},
        }
        status["facades"]["llamacpp"]["nodes"][0]["name"] = f"box {HOSTILE}"
        first, second = status["facades"]["llamacpp"]["nodes"]
        first["engine"] = ENGINE_STATE
        second["engine"] = {"state": "unknown", "cacheHitRatio": 0.125}
        status["queueing"] = QUEUEING
        status["residency"] = residency(first["id"], second["id"])
        return status

    def render(self, request: Request) -> bytes | int:
        if request.path == b"/status":
            request.setHeader(b"content-type", b"application/json")
            return json.dumps(self.status()).encode()
        if request.path == b"/":
            request.setHeader(b"content-type", b"text/html; charset=utf-8")
            request.setHeader(b"content-security-policy", PAGE_CSP)
            return renderPage(
                self.status(), historyDocument(self.service), Window().document(0)
            ).encode()
        rendered: bytes | int = self.ops.render(request)
        return rendered


def drawn(page: Element) -> list[Any]:
    """What a reader sees of the facades and workloads: texts, states, chart geometry."""
    shapes: list[Any] = []
    for root in page.all(id="summary") + page.all(id="facades") + page.all(id="workloads"):
        shapes.append(root.textContent())
        for element in root.all():
            if element.tag in ("polyline", "rect") or "data-state" in element.attrs:
                shapes.append((element.tag, sorted(element.attrs.items())))
    return shapes


class ScriptParityTests(TestCase):
    """On a frozen clock the script redraws exactly the page the server rendered."""

    timeout = 90

    def test_scriptDrawsWhatServerDraws(self) -> defer.Deferred[None]:
        """Same texts, states, charts, engine states, residency lines and affinity tile;
        engine-provided markup stays text in the browser too (no element injected, nothing
        logged to the console)."""
        return defer.Deferred.fromCoroutine(self._parity())

    async def _parity(self) -> None:
        binary = chromiumPath()
        if binary is None:
            raise SkipTest(NO_CHROMIUM)
        clock = MemoryReactorClock()
        clock.advance(1_764_000_000)
        service = makeService(clock)
        scripted(service)
        service.facades["llamacpp"].setSnapshot(
            Snapshot(
                parseNodes(
                    {
                        "nodes": [
                            {
                                "id": "A",
                                "addresses": ["http://10.0.0.1:8081"],
                                "models": [f"m{i}" for i in range(8)] + [HOSTILE],
                            },
                            {"id": HOSTILE, "models": ["m1"]},
                        ]
                    }
                ),
                ENGINE.normalize,
            )
        )
        for ttft, error in ((120, None), (480, HOSTILE), (60, None)):
            clock.advance(7)
            w = service.context.reporter.admit("llamacpp", HOSTILE if error else "m1")
            w.submitted("A")
            w.started("A")
            w.finish(
                "failed" if error else "completed",
                error,
                {"ttftMs": ttft, "completionTokens": 42, "tokensPerSecond": 31.5},
            )
        service.context.history.attempt("llamacpp", HOSTILE, "transport", None)
        site: ServerFactory[Any] = Site(_WithAffinity(service))
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        host = port.getHost()
        assert isinstance(host, IPv4Address)
        url = f"http://127.0.0.1:{host.port}/"
        profile = tempfile.mkdtemp(prefix="nvpair-chromium-")
        self.addCleanup(shutil.rmtree, profile, True)
        dom = await runChromium(binary, url, profile)
        served = parseDom(await (await treq.get(url, persistent=False)).text("utf-8"))
        self.assertEqual(dom.all(id="live")[0].attrs["data-source"], "js")
        self.assertEqual(dom.all("img"), [])
        self.assertEqual([s.attrs.get("src") for s in dom.all("script")], ["/ops.js"])
        self.assertEqual(drawn(dom), drawn(served))
        engines = [e.textContent() for e in dom.all("div", class_="engine")]
        self.assertEqual(
            engines, ["slots 1/4 busy · 1 loaded · cache 83%", "engine state unknown · cache 13%"]
        )
        (tile,) = dom.all("div", class_="affinity")
        self.assertEqual(tile.textContent(), "affinity hit rate 75% hit 3 · miss 1")
        (queue,) = dom.all("div", class_="queue")
        self.assertEqual(
            queue.textContent(),
            f"queue 3 {HOSTILE} 0 waiting, last wait 12.5 s · m1 3 waiting, last wait 250 ms"
            " · held for a prefix 1 now, 1234 got its slot, 5 recomputed"
            f" · {HOSTILE} 0 waiting, 3 served, 1 refused · ide 2 waiting, 1500 served"
            " · unverified 1 waiting, 7 served, 2 refused",
        )
        (note,) = dom.all("div", class_="breaker")
        self.assertEqual(note.textContent(), "breaker open · opened 2×")
        resident = [e.textContent() for e in dom.all("div", class_="resident")]
        self.assertEqual(
            resident,
            [
                f"holds a, {HOSTILE} (loading), c (sleeping), d, +1 · 3 loads · 1 eviction",
                "holds no model",
            ],
        )
        hostile = dom.all("tr", class_="wl")[1]
        self.assertEqual(hostile.all("td")[3].textContent(), HOSTILE)
        self.assertEqual(hostile.all("td")[-1].textContent(), f"{HOSTILE} {HOSTILE}")
