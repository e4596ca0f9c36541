"""The operations page in a real browser: headless Chromium against the real process.

Standalone: two backends, one a fake engine and one a port nobody listens on, a few requests
served (and one refused), then Chromium loads ``/`` from the ops listener, runs the page's
script (which fetches the JSON and redraws) and hands back the DOM and a screenshot.  The test
reads what was rendered: node states, charts with data points, formatted statistics.  Under a
broker: discovered nodes are judged by the last attempt on them, on the page and in the history.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import SkipTest, TestCase

from nvpair.proxy.testing.fakeengine import Status
from tests.browser.chromium import NO_CHROMIUM, chromiumPath, runChromium
from tests.support.dom import Element, parseDom
from tests.support.harness import ProxyFixture, directNode, freePort, reservedPort, startEngine
from tests.support.standaloneharness import StandaloneProxy

BASELINE = 26.0  # the y of a zero in a sparkline (height 28, padding 2)


def yValues(svg: Element) -> list[float]:
    """Every y coordinate of a sparkline's lines."""
    ys = []
    for line in svg.all("polyline"):
        for pair in line.attrs["points"].split():
            ys.append(float(pair.split(",")[1]))
    return ys


def nodeStates(page: Element) -> dict[str, str]:
    """Each node row's state by node id."""
    return {r.attrs["data-node"]: r.attrs["data-state"] for r in page.all("tr", class_="node")}


def chartsOf(element: Element) -> dict[str, Element]:
    """The sparklines inside ``element`` by metric."""
    return {svg.attrs["data-metric"]: svg for svg in element.all("svg", class_="spark")}


class OpsPageBrowserTests(TestCase):
    """Headless Chromium renders the live page of a real standalone proxy."""

    timeout = 120

    def test_pageInChromium(self) -> defer.Deferred[None]:
        """Node states, charts with data points and formatted statistics are rendered."""
        return defer.Deferred.fromCoroutine(self._pageInChromium())

    async def _pageInChromium(self) -> None:
        binary = chromiumPath()
        if binary is None:
            raise SkipTest(NO_CHROMIUM)
        engine = startEngine(self, reactor, "openai", ["m1", "m2"], name="A")
        dead = f"http://127.0.0.1:{freePort()}"
        opsPort = reservedPort(self)
        proxy = StandaloneProxy(
            self,
            reactor,
            ["llamacpp"],
            [("llamacpp", engine.url), ("llamacpp", dead)],
            extra=["--ops-port", str(opsPort)],
        )
        await proxy.start()
        await proxy.waitForLog(lambda r: r.get("event") == "backend-up")
        await proxy.waitForLog(lambda r: r.get("event") == "backend-down")
        chat = proxy.url("llamacpp") + "/v1/chat/completions"
        messages = [{"role": "user", "content": "hi"}]
        for model, stream in (("m1", False), ("m2", True), ("m1", False), ("nobody-has-it", False)):
            body = {"model": model, "stream": stream, "messages": messages}
            response = await treq.post(chat, json=body, persistent=False)
            await treq.content(response)
        ops = f"http://127.0.0.1:{opsPort}"
        history = await (await treq.get(ops + "/status/history", persistent=False)).json()
        facade = history["facades"]["llamacpp"]
        self.assertEqual(facade["series"]["totals"]["requests"], 4)
        self.assertEqual(facade["series"]["totals"]["errorsByReason"], {"no_owner": 1})
        self.assertEqual(facade["nodes"][engine.url]["totals"]["completed"], 3)

        shots = self.mktemp()
        os.makedirs(shots)
        screenshot = os.path.join(shots, "ops.png")
        profile = tempfile.mkdtemp(prefix="nvpair-chromium-")
        self.addCleanup(shutil.rmtree, profile, True)
        dom = await runChromium(binary, ops + "/", profile, f"--screenshot={screenshot}")

        (live,) = dom.all(id="live")
        self.assertEqual(live.attrs.get("data-source"), "js", "the page's script did not run")
        self.assertIn("on", live.attrs["class"].split())
        # Five seconds of the page's (virtual) time: drawn at load, then again every 2 s.
        self.assertGreaterEqual(int(live.attrs["data-refreshes"]), 3)
        for element in dom.all("script") + dom.all("link"):
            source = element.attrs.get("src") or element.attrs.get("href", "")
            self.assertTrue(source.startswith("/"), f"loads {source} from elsewhere")

        rows = {row.attrs["data-node"]: row for row in dom.all("tr", class_="node")}
        self.assertEqual(set(rows), {engine.url, dead})
        self.assertEqual(rows[engine.url].attrs["data-state"], "up")
        self.assertEqual(rows[dead].attrs["data-state"], "down")
        (badge,) = rows[dead].all("span", class_="state")
        self.assertEqual(badge.textContent(), "down")
        self.assertIn("inventory poll failed", rows[dead].textContent())
        self.assertEqual(
            [m.textContent() for m in rows[engine.url].all("span", class_="model")], ["m1", "m2"]
        )

        charts = chartsOf(rows[engine.url])
        self.assertEqual(set(charts), {"rps", "ttft", "tps", "errors"})
        for metric in ("rps", "tps", "ttft"):
            self.assertTrue(
                any(y < BASELINE for y in yValues(charts[metric])),
                f"the {metric} chart of the serving node has no data point",
            )
        self.assertFalse(any(y < BASELINE for y in yValues(chartsOf(rows[dead])["rps"])))
        (card,) = dom.all("section", class_="facade")
        (errors,) = card.all("div", class_="errors")
        self.assertEqual(len(errors.all("rect")), 1)
        self.assertIn("no node serves this model", errors.all("svg")[0].attrs["aria-label"])

        workloads = dom.all("tr", class_="wl")
        self.assertEqual(
            [w.attrs["data-state"] for w in workloads],
            ["failed", "completed", "completed", "completed"],
        )
        failed = [td.textContent() for td in workloads[0].all("td")]
        self.assertEqual(failed[0], "4")
        self.assertEqual(failed[-1], "no node serves this model no_owner")
        served = [td.textContent() for td in workloads[1].all("td")]
        self.assertEqual(served[3:5], ["m1", engine.url])
        self.assertRegex(served[6], r"^\d+ ms$")  # TTFT
        self.assertRegex(served[7], r"^7 / 3$")  # tokens in / out (the fake engine's usage)
        self.assertRegex(served[9], r"^\d+ ms$")  # duration

        # Without JavaScript the page as served says the same (Chromium's --dump-dom itself
        # needs script, so the served HTML is read directly).
        html = await (await treq.get(ops + "/", persistent=False)).text("utf-8")
        static = parseDom(html)
        (live,) = static.all(id="live")
        self.assertEqual(live.attrs.get("data-source"), "server")
        self.assertEqual(
            {r.attrs["data-node"]: r.attrs["data-state"] for r in static.all("tr", class_="node")},
            {engine.url: "up", dead: "down"},
        )
        self.assertTrue(
            any(
                y < BASELINE
                for y in yValues(
                    chartsOf(static.all("tr", class_="node", **{"data-node": engine.url})[0])["rps"]
                )
            )
        )

        # ... and the script draws what the server draws (bar the "ended ... ago" column).
        def workloadCells(page: Element) -> list[list[str]]:
            rows = [[td.textContent() for td in r.all("td")] for r in page.all("tr", class_="wl")]
            return [r[:1] + r[2:] for r in rows]

        def nodeValues(page: Element) -> list[list[str]]:
            return [
                [v.textContent() for v in r.all("span", class_="sv")]
                + [m.textContent() for m in r.all("span", class_="model")]
                for r in page.all("tr", class_="node")
            ]

        self.assertEqual(workloadCells(static), workloadCells(dom))
        self.assertEqual(nodeValues(static), nodeValues(dom))
        self.assertEqual(len(static.all("tr", class_="wl")), 4)

        with open(screenshot, "rb") as f:
            png = f.read()
        self.assertTrue(png.startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertGreater(len(png), 20000)


class OpsPageBrokerTests(TestCase):
    """Under a broker the real process judges discovered nodes by its last attempt on them."""

    timeout = 90

    def test_statesFromAttempts(self) -> defer.Deferred[None]:
        """A node that refused the connection is down, one that answered 503 and one that
        served are up, one never tried is unknown; the page and the history agree."""
        return defer.Deferred.fromCoroutine(self._statesFromAttempts())

    async def _statesFromAttempts(self) -> None:
        answering = startEngine(self, reactor, "openai", ["m1"], name="B")
        serving = startEngine(self, reactor, "openai", ["m1"], name="C")
        idle = startEngine(self, reactor, "openai", ["other"], name="D")
        opsPort = reservedPort(self)
        proxy = ProxyFixture(self, reactor, ["--ops-port", str(opsPort)])
        await proxy.start()
        port = await proxy.enable("llamacpp")
        deadAddress = f"http://127.0.0.1:{freePort()}"
        dead = {"id": "A", "self": False, "addresses": [deadAddress], "models": ["m1"]}
        # With no scheduler order the default order (by id) is tried: A, then B, then C.
        await proxy.nodes(
            "llamacpp",
            [dead, directNode("B", answering), directNode("C", serving), directNode("D", idle)],
        )
        answering.script(Status(503))
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m1", "messages": []},
            persistent=False,
        )
        await treq.content(response)
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-node"), ["C"])
        await proxy.waitFor("workload:completed")
        ops = f"http://127.0.0.1:{opsPort}"
        status = await (await treq.get(ops + "/status", persistent=False)).json()
        nodes = {n["id"]: n for n in status["facades"]["llamacpp"]["nodes"]}
        self.assertEqual(
            {k: (n["state"], n["stateReason"]) for k, n in nodes.items()},
            {
                "A": ("down", "last attempt could not reach the engine"),
                "B": ("up", "last attempt answered status 503"),
                "C": ("up", "last attempt served"),
                "D": ("unknown", "listed by discovery, not tried yet"),
            },
        )
        history = await (await treq.get(ops + "/status/history", persistent=False)).json()
        series = history["facades"]["llamacpp"]["nodes"]
        self.assertEqual(series["A"]["totals"]["errorsByReason"], {"attempt transport": 1})
        self.assertEqual(series["B"]["totals"]["errorsByReason"], {"attempt status": 1})
        self.assertEqual(series["C"]["totals"]["completed"], 1)
        html = await (await treq.get(ops + "/", persistent=False)).text("utf-8")
        served = parseDom(html)
        expected = {"A": "down", "B": "up", "C": "up", "D": "unknown"}
        self.assertEqual(nodeStates(served), expected)
        binary = chromiumPath()
        if binary is None:
            raise SkipTest(NO_CHROMIUM + "; the served page was checked")
        shots = self.mktemp()
        os.makedirs(shots)
        profile = tempfile.mkdtemp(prefix="nvpair-chromium-")
        self.addCleanup(shutil.rmtree, profile, True)
        dom = await runChromium(
            binary, ops + "/", profile, f"--screenshot={os.path.join(shots, 'ops.png')}"
        )
        self.assertEqual(dom.all(id="live")[0].attrs.get("data-source"), "js")
        self.assertEqual(nodeStates(dom), expected)
        addresses = {
            r.attrs["data-node"]: r.all("div", class_="addr")[0].textContent()
            for r in dom.all("tr", class_="node")
        }
        self.assertEqual(
            addresses,
            {"A": deadAddress, "B": answering.url, "C": serving.url, "D": idle.url},
        )
