"""The exact bytes of every per-request notification (protocol §4-§5).

Workload events and node activity are written from templates rather than by the general
JSON encoder; these tests pin the bytes the broker receives and prove them identical to
the encoder's (compact, ``ensure_ascii=False``) for any model, node or error text.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.channel import BrokerChannel
from nvpair.proxy.broker.workloads import CANCELLED, COMPLETED, FAILED, WorkloadReporter
from nvpair.proxy.interfaces import IBrokerSink, IMessageHandler

RUN = "00ff00ff00ff00ff"
WI = '{"jsonrpc":"2.0","method":"workload:%s","params":{"workloadInfo":{"id":"1",'


@implementer(IMessageHandler)
class _NoHandler:
    def handle(self, engine: str | None, name: str, params: dict[str, Any]) -> object:
        raise AssertionError("no input expected")


@implementer(IBrokerSink)
class _Both:
    """A sink that writes through a real channel and keeps the params it was given."""

    listening = True

    def __init__(self, channel: BrokerChannel) -> None:
        self.channel = channel
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))
        self.channel.notify(method, params)


class GoldenTests(SynchronousTestCase):
    """A reporter and an activity counter writing through a ``BrokerChannel``."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1700000000.25)
        self.transport = StringTransport()
        self.channel = BrokerChannel(_NoHandler(), lambda: None)
        self.channel.makeConnection(self.transport)
        self.sink = _Both(self.channel)
        self.assertTrue(verifyObject(IBrokerSink, self.sink))
        self.assertTrue(verifyObject(IMessageHandler, _NoHandler()))
        self.reporter = WorkloadReporter(self.sink, self.clock, RUN)
        self.activity = Activity(self.sink)

    def lines(self) -> list[bytes]:
        data: bytes = self.transport.value()
        self.transport.clear()
        self.assertTrue(data.endswith(b"\n"))
        return data.split(b"\n")[:-1]

    def assertGeneric(self) -> None:
        """Every line sent is what the general encoder writes for the same params."""
        expected = b"".join(
            jsonrpc.encode(jsonrpc.notification(m, json.loads(json.dumps(p))))
            for m, p in self.sink.sent
        )
        self.assertEqual(self.transport.value(), expected)

    def lifecycle(self, model: str, node: str) -> None:
        w = self.reporter.admit("ollama", model)
        w.submitted(node)
        self.activity.change(node, +1)
        self.clock.advance(0.0125)
        w.started(node)
        self.clock.advance(2.5)
        w.finish(
            COMPLETED,
            None,
            {
                "promptTokens": 7,
                "completionTokens": 50,
                "tokensPerSecond": 20.04,
                "ttftMs": 12,
                "estimated": True,
            },
        )
        self.activity.change(node, -1)

    def test_lifecycleBytes(self) -> None:
        """A whole request's six notifications, byte for byte."""
        self.lifecycle("llama3:latest", "node-a")
        self.assertGeneric()
        head = (
            '"model":"llama3:latest","engine":"ollama","runId":"00ff00ff00ff00ff",'
            '"state":"%s","originatedFrom":"","createdAt":1700000000250,"error":null,'
            '"requesterId":null'
        )
        self.assertEqual(
            self.lines(),
            [
                ((WI % "submitted") + (head % "queued") + ',"seq":1}}}').encode(),
                (
                    (WI % "submitted") + (head % "queued") + ',"scheduledOn":"node-a","seq":2}}}'
                ).encode(),
                b'{"jsonrpc":"2.0","method":"discovery:node-activity",'
                b'"params":{"nodeId":"node-a","inFlight":1}}',
                (
                    (WI % "started")
                    + (head % "running")
                    + ',"scheduledOn":"node-a","startedAt":1700000000262,"seq":3}}}'
                ).encode(),
                (
                    (WI % "completed")
                    + (head % "completed")
                    + ',"scheduledOn":"node-a","startedAt":1700000000262,'
                    '"completedAt":1700000002762,"stats":{"promptTokens":7,"completionTokens":50,'
                    '"tokensPerSecond":20.04,"ttftMs":12,"estimated":true},"seq":4}}}'
                ).encode(),
                b'{"jsonrpc":"2.0","method":"discovery:node-activity",'
                b'"params":{"nodeId":"node-a","inFlight":0}}',
            ],
        )

    def test_erroredBytes(self) -> None:
        """Refused at admission (failed, ``no_owner``) and cancelled after placement."""
        w = self.reporter.admit("llamacpp", "m1")
        w.finish(FAILED, "no_owner")
        v = self.reporter.admit("llamacpp", "m1")
        v.submitted("B")
        v.finish(CANCELLED, "client disconnected")
        self.assertGeneric()
        common = (
            '"model":"m1","engine":"llamacpp","runId":"00ff00ff00ff00ff","state":"%s",'
            '"originatedFrom":"","createdAt":1700000000250,"error":%s,"requesterId":null'
        )
        second = WI.replace('"id":"1"', '"id":"2"')
        self.assertEqual(
            self.lines(),
            [
                ((WI % "submitted") + (common % ("queued", "null")) + ',"seq":1}}}').encode(),
                (
                    (WI % "errored")
                    + (common % ("failed", '"no_owner"'))
                    + ',"completedAt":1700000000250,"seq":2}}}'
                ).encode(),
                ((second % "submitted") + (common % ("queued", "null")) + ',"seq":3}}}').encode(),
                (
                    (second % "submitted")
                    + (common % ("queued", "null"))
                    + ',"scheduledOn":"B","seq":4}}}'
                ).encode(),
                (
                    (second % "errored")
                    + (common % ("cancelled", '"client disconnected"'))
                    + ',"scheduledOn":"B","completedAt":1700000000250,"seq":5}}}'
                ).encode(),
            ],
        )

    def test_nonAsciiModel(self) -> None:
        """Non-ASCII text is written as UTF-8, not escaped (the encoder's ensure_ascii=False)."""
        self.reporter.admit("ollama", "modèle-日本:latest").submitted("nœud")
        self.activity.change("nœud", 1)
        self.assertGeneric()
        lines = self.lines()
        self.assertIn('"model":"modèle-日本:latest"'.encode(), lines[0])
        self.assertIn('"scheduledOn":"nœud"'.encode(), lines[1])
        self.assertEqual(
            lines[2],
            '{"jsonrpc":"2.0","method":"discovery:node-activity",'
            '"params":{"nodeId":"nœud","inFlight":1}}'.encode(),
        )

    def test_escapedModel(self) -> None:
        """Quotes, backslashes and control characters get the encoder's escapes."""
        w = self.reporter.admit("ollama", 'a"b\\c\n\t\x01\u2028')
        w.finish(FAILED, 'upstream "status" 500\\')
        self.assertGeneric()
        lines = self.lines()
        self.assertIn(b'"model":"a\\"b\\\\c\\n\\t\\u0001\xe2\x80\xa8"', lines[0])
        self.assertIn(b'"error":"upstream \\"status\\" 500\\\\"', lines[1])

    def test_loneSurrogate(self) -> None:
        """A lone surrogate (a client's ``"\\ud800"``) is escaped, so the line stays UTF-8;
        the general encoder would raise."""
        self.reporter.admit("ollama", "x\ud800y")
        [line] = self.lines()
        self.assertIn(b'"model":"x\\ud800y"', line)
        self.assertEqual(json.loads(line)["params"]["workloadInfo"]["model"], "x\ud800y")
        self.assertEqual(jsonrpc.encode({"m": "\udfff"}), b'{"m":"\\udfff"}\n')

    def test_sinksSeePlainDicts(self) -> None:
        """What a sink receives still compares equal to the plain params dicts."""
        self.lifecycle("m1", "E")
        method, params = self.sink.sent[5]
        self.assertEqual(
            (method, params), ("discovery:node-activity", {"nodeId": "E", "inFlight": 0})
        )
        self.assertEqual(json.loads(json.dumps(self.sink.sent[4][1])), self.sink.sent[4][1])

    @settings(max_examples=300, deadline=None)
    @given(
        st.text(),
        st.text(),
        st.one_of(st.none(), st.text()),
        st.sampled_from(
            [
                None,
                {},
                {"ttftMs": 0},
                {"completionTokens": 3, "tokensPerSecond": 1e-7, "estimated": True},
                {"tokensPerSecond": float("inf")},
            ]
        ),
    )
    def test_sameAsEncoder(
        self, model: str, node: str, error: str | None, stats: dict[str, Any] | None
    ) -> None:
        """For any text, the template writes the general encoder's bytes."""
        self.sink.sent.clear()
        self.transport.clear()
        w = self.reporter.admit("lmstudio", model)
        w.submitted(node)
        self.activity.change(node, 1)
        w.started(node)
        w.finish(COMPLETED if error is None else FAILED, error, stats)
        self.activity.change(node, -1)
        expected = b"".join(
            jsonrpc.encode(jsonrpc.notification(m, dict(p))) for m, p in self.sink.sent
        )
        self.assertEqual(self.transport.value(), expected)

    def test_preparedLineDefault(self) -> None:
        """``Prepared`` params without a template fall back to the encoder, byte for byte."""
        params = jsonrpc.Prepared(kind="x", message="ü")
        self.assertEqual(
            params.line("errors:report"),
            jsonrpc.encode(jsonrpc.notification("errors:report", dict(params))),
        )
        self.assertEqual(
            jsonrpc.notificationLine("m", {"a": 1}),
            b'{"jsonrpc":"2.0","method":"m","params":{"a":1}}\n',
        )
