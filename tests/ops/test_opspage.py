"""Tests for the server-rendered ops page: human units, sparklines, states and escaping."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.ops.documents import StatusDocument
from nvpair.proxy.ops.format import (
    ago,
    bar,
    fixed,
    millis,
    number,
    reasonText,
    seconds,
    sparkline,
)
from nvpair.proxy.ops.history import Window
from nvpair.proxy.ops.page import renderPage
from nvpair.proxy.ops.server import historyDocument, opsResource, statusDocument
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.nodes import parseNodes
from tests.ops.opskit import ENGINE, EndpointTestCase, makeService, memoryClient, scripted
from tests.support.dom import Element, parseDom

HOSTILE_MODEL = "<script>alert('model')</script>"
HOSTILE_NODE = '"><img src=x onerror=alert(1)>'
HOSTILE_ERROR = "<img src=x onerror=alert('error')>"


def points(svg: Element) -> list[str]:
    """The ``points`` of each polyline of a sparkline."""
    return [line.attrs["points"] for line in svg.all("polyline")]


class UnitTests(SynchronousTestCase):
    """Numbers in human units."""

    def test_durations(self) -> None:
        """Milliseconds below a second, then seconds, minutes and hours; None is a dash."""
        self.assertEqual(
            [millis(v) for v in (None, 0, 412.4, 999, 1500, 12_345, 125_000)],
            ["–", "0 ms", "412 ms", "999 ms", "1.50 s", "12.3 s", "2 min 5 s"],
        )
        self.assertEqual(seconds(7322), "2 h 2 min")
        self.assertEqual(seconds(0.25), "250 ms")

    def test_ago(self) -> None:
        """How long ago, coarsely."""
        self.assertEqual(
            [ago(s) for s in (0.2, 4.4, 61, 7300)], ["just now", "4 s ago", "1 min ago", "2 h ago"]
        )

    def test_numbers(self) -> None:
        """Counts stay whole, small rates keep two digits, large ones get k and M."""
        self.assertEqual(
            [number(v) for v in (None, 0, 7, 0.25, 3.456, 12.34, 812.6, 9999, 76818.75, 3_100_000)],
            ["–", "0", "7", "0.25", "3.46", "12.3", "813", "9999", "76.8k", "3.1M"],
        )
        self.assertEqual(number(0.1), "0.1")

    def test_roundingAsTheScript(self) -> None:
        """Exact halves round up, as JavaScript's ``toFixed`` does (the script draws the same
        numbers); values just below a half, as binary holds them, round down."""
        self.assertEqual((fixed(2.5, 0), fixed(0.125, 2), fixed(1.005, 2)), ("3", "0.13", "1.00"))
        self.assertEqual(millis(2.5), "3 ms")
        self.assertEqual(number(0.125), "0.13")

    def test_reasons(self) -> None:
        """Reason codes in words; engine statuses named; unknown text shown as it is."""
        self.assertEqual(reasonText("no_owner"), "no node serves this model")
        self.assertEqual(reasonText("upstream status 503"), "engine answered 503")
        self.assertEqual(reasonText("attempt transport"), "attempt could not reach the engine")
        self.assertEqual(reasonText("something new"), "something new")
        self.assertEqual(reasonText(None), "")


class SparklineTests(SynchronousTestCase):
    """Inline SVG charts."""

    def chart(self, values: list[float | None], bars: bool = False) -> Element:
        (svg,) = parseDom(sparkline("rps", values, "label <b>", bars)).all("svg")
        return svg

    def test_line(self) -> None:
        """Values scale to the chart's height (zero at the baseline y=26, the top at y=2)
        from left to right; inner points of flat runs are left out."""
        svg = self.chart([0, 0, 5, 10])
        self.assertEqual(points(svg), ["2,26 40.7,26 79.3,14 118,2"])
        self.assertEqual(points(self.chart([0, 0, 0, 10])), ["2,26 79.3,26 118,2"])
        self.assertEqual(svg.attrs["data-metric"], "rps")
        self.assertEqual(svg.attrs["data-max"], "10")
        (title,) = svg.all("title")
        self.assertEqual(title.textContent(), "label <b>")

    def test_flat(self) -> None:
        """All zeros: one line along the baseline."""
        self.assertEqual(points(self.chart([0.0] * 90)), ["2,26 118,26"])

    def test_gaps(self) -> None:
        """A None (no TTFT in that bucket) breaks the line; a lone value is a short dash."""
        svg = self.chart([4, 4, None, None, 2])
        self.assertEqual(points(svg), ["2,2 31,2", "116.5,14 118,14"])
        self.assertEqual(points(self.chart([None, None])), [])

    def test_bars(self) -> None:
        """Error counts are bars, one per non-empty bucket, the tallest full height."""
        svg = self.chart([0, 2, 0, 4], bars=True)
        rects = [(r.attrs["x"], r.attrs["y"], r.attrs["height"]) for r in svg.all("rect")]
        self.assertEqual(rects, [("31", "14", "12"), ("89", "2", "24")])
        self.assertEqual(svg.all("polyline"), [])

    def test_meter(self) -> None:
        """A bar's fill is its share of the scale, capped at full; the value follows it."""
        (fill,) = parseDom(bar("inflight", 1, 4, "in flight")).all("rect", class_="fill")
        self.assertEqual(fill.attrs["width"], "15")
        (fill,) = parseDom(bar("inflight", 9, 4, "in flight")).all("rect", class_="fill")
        self.assertEqual(fill.attrs["width"], "60")
        self.assertIn("9 in flight", parseDom(bar("inflight", 9, 4, "in flight")).textContent())


class ServedTests(EndpointTestCase):
    """GET /, /ops.js and /ops.css: where the page loads from and under which policy."""

    def test_page(self) -> None:
        """The page is server-rendered HTML that loads its script and style from the listener
        only, under a strict content policy with no inline script or style allowed."""
        response, body = self.get("http://127.0.0.1:9464/")
        self.assertEqual(response.code, 200)
        self.assertEqual(
            response.headers.getRawHeaders("content-type"), ["text/html; charset=utf-8"]
        )
        csp = response.headers.getRawHeaders("content-security-policy")[0]
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        self.assertEqual(directives["default-src"], "'none'")
        self.assertEqual(directives["script-src"], "'self'")
        self.assertEqual(directives["style-src"], "'self'")
        self.assertEqual(directives["connect-src"], "'self'")
        self.assertNotIn("unsafe", csp)
        dom = parseDom(body.decode())
        (script,) = dom.all("script")
        self.assertEqual((script.attrs["src"], script.content), ("/ops.js", []))
        (sheet,) = dom.all("link", rel="stylesheet")
        self.assertEqual(sheet.attrs["href"], "/ops.css")
        self.assertEqual(dom.all("style"), [])
        (refresh,) = dom.all("meta", **{"http-equiv": "refresh"})
        self.assertEqual(refresh.attrs["content"], "10")
        self.assertEqual(dom.all("noscript")[0].children, [refresh])  # only without script
        self.assertNotIn(b" style=", body)
        self.assertEqual(len(dom.all("section", class_="facade")), 1)

    def test_assets(self) -> None:
        """The script and style sheet are served with their types and fetch nothing elsewhere;
        the script reads the two JSON documents and never parses text as HTML."""
        response, script = self.get("http://127.0.0.1/ops.js")
        self.assertEqual(
            response.headers.getRawHeaders("content-type"), ["text/javascript; charset=utf-8"]
        )
        self.assertIn(b'json("/status")', script)
        self.assertIn(b'json("/status/history")', script)
        self.assertIn(b"setInterval(refresh, 2000)", script)
        for unsafe in (
            b"innerHTML",
            b"outerHTML",
            b"insertAdjacentHTML",
            b"eval(",
            b"document.write",
        ):
            self.assertNotIn(unsafe, script)
        response, style = self.get("http://127.0.0.1/ops.css")
        self.assertEqual(
            response.headers.getRawHeaders("content-type"), ["text/css; charset=utf-8"]
        )
        for asset in (script.replace(b"http://www.w3.org/2000/svg", b""), style):
            self.assertNotIn(b"http", asset)
            self.assertNotIn(b"url(", asset)
            self.assertNotIn(b"@import", asset)


class PageTests(SynchronousTestCase):
    """The page as rendered by the ops listener."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.service = makeService(self.reactor)
        scripted(self.service)

    def page(self) -> Element:
        response = self.successResultOf(
            memoryClient(opsResource(self.service)).get("http://127.0.0.1/")
        )
        self.assertEqual(response.code, 200)
        return parseDom(self.successResultOf(response.content()).decode("utf-8"))

    def rows(self, dom: Element) -> dict[str, Element]:
        return {row.attrs["data-node"]: row for row in dom.all("tr", class_="node")}

    def test_states(self) -> None:
        """Each node row carries its state as a coloured badge and says why."""
        self.service.context.history.attempt("llamacpp", "A", "transport", None)
        rows = self.rows(self.page())
        self.assertEqual(
            {k: r.attrs["data-state"] for k, r in rows.items()}, {"A": "down", "me": "unknown"}
        )
        (badge,) = rows["A"].all("span", class_="state")
        self.assertEqual(badge.attrs["class"], "state down")
        (why,) = rows["A"].all("div", class_="why")
        self.assertEqual(why.textContent(), "last attempt could not reach the engine · just now")
        self.assertEqual(
            [m.textContent() for m in rows["A"].all("span", class_="model")], ["m1", "m2"]
        )
        self.assertIn("self", rows["me"].textContent())
        (addresses,) = rows["A"].all("div", class_="addr")
        self.assertEqual(addresses.textContent(), "http://10.0.0.2:8081 http://10.0.0.1:8081")
        self.assertEqual(rows["me"].all("div", class_="addr"), [])

    def test_manyModels(self) -> None:
        """Six model names are shown; the rest are counted, and named in the tooltip."""
        names = [f"model-{i:02d}" for i in range(9)] + ["<b>x</b>"]
        self.service.facades["llamacpp"].setSnapshot(
            Snapshot(parseNodes({"nodes": [{"id": "A", "models": names}]}), ENGINE.normalize)
        )
        (row,) = self.page().all("tr", class_="node")
        self.assertEqual(
            [m.textContent() for m in row.all("span", class_="model")], sorted(names)[:6]
        )
        (more,) = row.all("span", class_="more")
        self.assertEqual(more.textContent(), "+4 more")
        self.assertEqual(more.attrs["title"], ", ".join(sorted(names)[6:]))

    def test_work(self) -> None:
        """In-flight and reserved work as bars scaled to the busiest node, and the load."""
        self.service.context.activity.change("A", +1)
        rows = self.rows(self.page())
        inflight, reserved = rows["A"].all("span", class_="meter")
        self.assertEqual(inflight.all("rect", class_="fill")[0].attrs["width"], "60")
        self.assertEqual(inflight.textContent(), "2 in flight")
        self.assertEqual(reserved.all("rect", class_="fill")[0].attrs["width"], "30")
        self.assertEqual(rows["A"].all("td", class_="num")[0].textContent(), "3.5")

    def test_charts(self) -> None:
        """Facade tiles and node rows hold the four charts; served work shows as data points."""
        self.reactor.advance(10)
        done = self.service.context.reporter.admit("llamacpp", "m1")
        done.submitted("A")
        done.started("A")
        done.finish("completed", None, {"ttftMs": 80, "completionTokens": 40})
        dom = self.page()
        (card,) = dom.all("section", class_="facade")
        tiles = {t.attrs["class"].split()[1]: t for t in card.all("div", class_="tile")}
        self.assertEqual(set(tiles), {"rps", "ttft", "tps", "errors"})
        self.assertEqual(tiles["ttft"].all("div", class_="tval")[0].textContent(), "88 ms")
        self.assertEqual(
            tiles["errors"].all("div", class_="tsub")[0].textContent(),
            "no node serves this model ×1",
        )
        self.assertEqual(len(tiles["errors"].all("rect")), 1)
        charts = {s.attrs["data-metric"]: s for s in self.rows(dom)["A"].all("svg", class_="spark")}
        # The scripted workload (3 tokens) a bucket earlier, this one (40 tokens) now.
        self.assertEqual(points(charts["rps"]), ["2,26 115.4,26 116.7,2 118,2"])
        self.assertEqual(points(charts["tps"]), ["2,26 115.4,26 116.7,24.2 118,2"])
        self.assertEqual(points(charts["ttft"]), ["116.5,2 118,2"])
        self.assertEqual(self.rows(dom)["A"].all("span", class_="sv")[1].textContent(), "88 ms")

    def test_workloadsInHumanUnits(self) -> None:
        """Recent workloads newest first with TTFT, tokens, rate and duration in units, the
        error in words, and the terminal state as the row's class."""
        w = self.service.context.reporter.admit("llamacpp", "m1")
        w.submitted("A")
        w.started("A")
        self.reactor.advance(1.5)
        w.finish(
            "completed",
            None,
            {
                "ttftMs": 412,
                "promptTokens": 7,
                "completionTokens": 50,
                "tokensPerSecond": 76818.75,
                "estimated": True,
            },
        )
        dom = self.page()
        newest, failed, older = dom.all("tr", class_="wl")
        cells = [td.textContent() for td in newest.all("td")]
        self.assertEqual(
            cells,
            [
                "4",
                "just now",
                "completed",
                "m1",
                "A",
                "1",
                "412 ms",
                "7 / 50 (est.)",
                "76.8k/s",
                "1.50 s",
                "",
            ],
        )
        self.assertEqual(newest.attrs["class"], "wl completed")
        self.assertEqual(failed.attrs["class"], "wl failed")
        self.assertEqual(failed.all("td")[-1].textContent(), "no node serves this model no_owner")
        self.assertEqual(older.all("td")[1].textContent(), "4 s ago")

    def test_escaping(self) -> None:
        """Engine- and client-provided text (model names, node ids, error reasons) is text,
        never markup: the only script is the page's own, no element is injected."""
        facade = self.service.facades["llamacpp"]
        facade.setSnapshot(
            Snapshot(
                parseNodes({"nodes": [{"id": HOSTILE_NODE, "models": [HOSTILE_MODEL]}]}),
                ENGINE.normalize,
            )
        )
        w = self.service.context.reporter.admit("llamacpp", HOSTILE_MODEL)
        w.submitted(HOSTILE_NODE)
        w.started(HOSTILE_NODE)
        w.finish("failed", HOSTILE_ERROR)
        self.service.context.history.attempt("llamacpp", HOSTILE_NODE, "transport", None)
        dom = self.page()
        self.assertEqual([s.attrs.get("src") for s in dom.all("script")], ["/ops.js"])
        self.assertEqual(dom.all("img"), [])
        (row,) = dom.all("tr", class_="node")
        self.assertEqual(row.attrs["data-node"], HOSTILE_NODE)
        self.assertEqual(row.all("span", class_="model")[0].textContent(), HOSTILE_MODEL)
        newest = dom.all("tr", class_="wl")[0]
        self.assertEqual(newest.all("td")[3].textContent(), HOSTILE_MODEL)
        self.assertEqual(newest.all("td")[-1].textContent(), f"{HOSTILE_ERROR} {HOSTILE_ERROR}")
        tiles = dom.all("div", class_="errors")
        self.assertIn(HOSTILE_ERROR, tiles[0].all("svg")[0].attrs["aria-label"])

    def affinityTiles(self, status: StatusDocument) -> list[Element]:
        html = renderPage(status, historyDocument(self.service), Window().document(0))
        return parseDom(html).all("div", class_="affinity")

    def test_affinity(self) -> None:
        """Where the status has conversation-affinity counters (the process-wide ``affinity``
        object when active, or the facade's own) a tile shows the hit rate; else none."""
        status = statusDocument(self.service)
        self.assertEqual(self.affinityTiles(status), [])
        status["affinity"] = {"mode": "off", "active": False}
        self.assertEqual(self.affinityTiles(status), [])
        status["affinity"] = {"mode": "prefix", "active": True, "entries": 0, "counts": {}}
        (tile,) = self.affinityTiles(status)
        self.assertEqual(tile.all("div", class_="tval")[0].textContent(), "–")
        self.assertEqual(tile.all("div", class_="tsub")[0].textContent(), "no placements yet")
        status["affinity"]["counts"] = {"llamacpp": {"hit": 6, "miss": 3, "overridden": 1}}
        (tile,) = self.affinityTiles(status)
        self.assertEqual(tile.all("div", class_="tval")[0].textContent(), "60%")
        self.assertEqual(
            tile.all("div", class_="tsub")[0].textContent(), "hit 6 · miss 3 · overridden 1"
        )
        status["facades"]["llamacpp"]["affinity"] = {"hits": 8, "misses": 2, "<b>": True}
        (tile,) = self.affinityTiles(status)
        self.assertEqual(tile.all("div", class_="tval")[0].textContent(), "80%")
        self.assertEqual(tile.all("div", class_="tsub")[0].textContent(), "hits 8 · misses 2")

    def test_empty(self) -> None:
        """A process with nothing enabled and no workload says so."""
        service = makeService(MemoryReactorClock())
        html = renderPage(statusDocument(service), historyDocument(service), Window().document(0))
        texts = [p.textContent() for p in parseDom(html).all(class_="none")]
        self.assertEqual(texts, ["no facade is enabled yet", "no workload has ended yet"])


class HistoryEndpointTests(SynchronousTestCase):
    """GET /status/history."""

    def test_document(self) -> None:
        """The history JSON per facade and node, with the reasons seen put in words."""
        reactor = MemoryReactorClock()
        service = makeService(reactor)
        scripted(service)
        service.context.history.attempt("llamacpp", "A", "transport", None)
        response = self.successResultOf(
            memoryClient(opsResource(service)).get("http://localhost/status/history")
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        doc: dict[str, Any] = json.loads(self.successResultOf(response.content()))
        self.assertEqual((doc["bucketSeconds"], doc["buckets"]), (10, 90))
        facade = doc["facades"]["llamacpp"]
        self.assertEqual(facade["series"]["totals"]["requests"], 2)
        self.assertEqual(facade["nodes"]["A"]["totals"]["errorsByReason"], {"attempt transport": 1})
        self.assertEqual(
            doc["reasons"],
            {
                "attempt transport": "attempt could not reach the engine",
                "no_owner": "no node serves this model",
            },
        )
