"""The broker channel's line framing: bad input is dropped and reported
and the channel goes on; over-long, exact-limit and split lines."""

from __future__ import annotations

import json

from nvpair.proxy.broker import jsonrpc
from tests.broker.channelkit import ChannelCase


class ChannelTests(ChannelCase):
    """Framing and survival of bad input."""

    def test_notJSON(self) -> None:
        """A line that is not JSON is dropped and reported; the channel goes on."""
        self.send(b"this is not json\n")
        self.assertOnlyProtocolReport()
        self.send(b"\xff\xfe{\n")
        self.assertOnlyProtocolReport()
        self.send({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {}})
        self.assertEqual(self.output()[0]["id"], 1)

    def test_notObject(self) -> None:
        """A JSON value that is not an object is dropped and reported."""
        for line in (b"[1,2]\n", b"42\n", b'"s"\n', b"null\n"):
            self.send(line)
            self.assertOnlyProtocolReport()
        self.assertEqual(self.handler.calls, [])

    def test_blankLinesIgnored(self) -> None:
        """Empty lines are neither handled nor reported."""
        self.send(b"\n  \n")
        self.assertEqual(self.output(), [])

    def test_responseFromBroker(self) -> None:
        """A response object from the broker is reported, never handled or answered."""
        self.send({"jsonrpc": "2.0", "id": 5, "result": {}})
        self.send({"jsonrpc": "2.0", "id": 6, "error": {"code": 1, "message": "x"}})
        self.assertEqual(len(self.reports(self.output())), 2)
        self.assertEqual(self.handler.calls, [])

    def test_noMethod(self) -> None:
        """A request without a method is answered -32600 and reported."""
        self.send({"jsonrpc": "2.0", "id": 5})
        out = self.output()
        self.assertEqual(self.reports(out)[0]["kind"], "protocol")
        answers = [m for m in out if "id" in m]
        self.assertEqual(answers[0]["error"]["code"], jsonrpc.INVALID_REQUEST)

    def test_badId(self) -> None:
        """A request whose id is not a string, number or null is dropped and reported."""
        self.send({"jsonrpc": "2.0", "id": {"a": 1}, "method": "x", "params": {}})
        self.assertOnlyProtocolReport()
        self.assertEqual(self.handler.calls, [])

    def test_overlongLine(self) -> None:
        """A line over 1 MiB is dropped whole and reported once; the next line is handled."""
        big = b"x" * (jsonrpc.MAX_LINE + 10)
        for i in range(0, len(big), 65536):
            self.send(big[i : i + 65536])
        self.send(b'garbage-tail"}\n')
        self.assertOnlyProtocolReport()
        self.send({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {}})
        self.assertEqual(self.output(), [{"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}])

    def test_overlongLineInOneChunk(self) -> None:
        """An over-long line arriving with its newline in one write is dropped and reported."""
        self.send(
            b"{"
            + b" " * (jsonrpc.MAX_LINE + 1)
            + b"}\n"
            + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "x"}).encode()
            + b"\n"
        )
        out = self.output()
        self.assertEqual(self.reports(out)[0]["kind"], "protocol")
        self.assertEqual(out[-1]["id"], 2)

    def test_lineAtLimit(self) -> None:
        """A line of exactly 1 MiB is accepted."""
        message = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"p": ""}})
        pad = jsonrpc.MAX_LINE - len(message)
        line = message[:-2] + " " * pad + "}}"
        self.assertEqual(len(line), jsonrpc.MAX_LINE)
        self.send(line.encode() + b"\n")
        self.assertEqual(self.output()[0]["result"], {"ok": True})

    def test_splitAcrossWrites(self) -> None:
        """A message split across several writes is handled once complete."""
        data = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x"}).encode() + b"\n"
        for byte in data:
            self.send(bytes([byte]))
        self.assertEqual(len(self.output()), 1)
