"""JSON log lines on stderr (protocol §10) with a runtime-switchable level."""

from __future__ import annotations

import io
import json
from typing import Any

from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.runtime.logs import JSONLineObserver, LogControl, makeObserver, toRecord


class LogTests(SynchronousTestCase):
    """Records written through ``makeObserver`` to a text stream."""

    def setUp(self) -> None:
        self.stream = io.StringIO()
        self.control = LogControl("info")
        self.log = Logger(
            namespace="nvpair.proxy.test", observer=makeObserver(self.stream, self.control)
        )

    def records(self) -> list[dict[str, Any]]:
        lines = self.stream.getvalue().splitlines()
        self.stream.seek(0)
        self.stream.truncate()
        return [json.loads(line) for line in lines]

    def test_shape(self) -> None:
        """A record has time, level, component, event and its operational fields."""
        self.log.info("facade-enabled", engine="ollama", port=11435)
        [record] = self.records()
        self.assertIsInstance(record["time"], float)
        self.assertEqual(record["level"], "info")
        self.assertEqual(record["component"], "nvpair-proxy")
        self.assertEqual(record["event"], "facade-enabled")
        self.assertEqual(record["engine"], "ollama")
        self.assertEqual(record["port"], 11435)
        self.assertFalse([k for k in record if k.startswith("log_")])

    def test_formattedEvent(self) -> None:
        """A format string is rendered into ``event``."""
        self.log.warn("port {port} busy", port=5)
        self.assertEqual(self.records()[0]["event"], "port 5 busy")

    def test_levels(self) -> None:
        """Twisted levels map to debug/info/warn/error (critical is error)."""
        self.control.setLevel("debug")
        self.log.debug("a")
        self.log.info("b")
        self.log.warn("c")
        self.log.error("d")
        self.log.critical("e")
        self.assertEqual(
            [r["level"] for r in self.records()], ["debug", "info", "warn", "error", "error"]
        )

    def test_filtering(self) -> None:
        """Records below the active level are not written."""
        self.log.debug("hidden")
        self.log.info("shown")
        self.assertEqual([r["event"] for r in self.records()], ["shown"])

    def test_switching(self) -> None:
        """``setLevel`` takes effect for the next record, both ways."""
        self.control.setLevel("error")
        self.log.warn("w1")
        self.log.error("e1")
        self.control.setLevel("debug")
        self.log.debug("d1")
        self.control.setLevel("warn")
        self.log.info("i1")
        self.log.warn("w2")
        self.assertEqual([r["event"] for r in self.records()], ["e1", "d1", "w2"])

    def test_otherNamespaces(self) -> None:
        """The level applies to every namespace (twisted's own records too)."""
        other = Logger(
            namespace="twisted.internet.tcp", observer=makeObserver(self.stream, self.control)
        )
        self.control.setLevel("warn")
        other.info("Port closed")
        other.warn("w")
        self.assertEqual([r["event"] for r in self.records()], ["w"])

    def test_enabled(self) -> None:
        """``enabled`` answers whether a level would be written."""
        self.assertFalse(self.control.enabled("debug"))
        self.assertTrue(self.control.enabled("info"))
        self.control.setLevel("error")
        self.assertFalse(self.control.enabled("warn"))
        self.assertTrue(self.control.enabled("error"))

    def test_failure(self) -> None:
        """A failure record names the exception type and carries the stack."""
        try:
            raise KeyError("k")
        except KeyError:
            self.log.failure("request-crashed", engine="llamacpp")
        [record] = self.records()
        self.assertEqual(record["level"], "error")
        self.assertEqual(record["exception"], "KeyError")
        self.assertIn("Traceback", record["traceback"])
        self.assertEqual(record["engine"], "llamacpp")

    def test_unserializable(self) -> None:
        """Values JSON cannot encode are written as text; the line is still one JSON object."""
        self.log.info("odd", thing=object(), data=b"\x00")
        [record] = self.records()
        self.assertEqual(record["event"], "odd")
        self.assertIsInstance(record["thing"], str)

    def test_legacyEvent(self) -> None:
        """A legacy-style event (twistd's own messages) becomes a record too."""
        observer = JSONLineObserver(self.stream)
        observer(
            {
                "log_level": LogLevel.info,
                "log_time": 1.0,
                "log_format": None,
                "message": ("Server Shut Down.",),
                "isError": 0,
                "system": "-",
                "log_namespace": "twisted",
            }
        )
        [record] = self.records()
        self.assertEqual(record["level"], "info")
        self.assertEqual(record["component"], "nvpair-proxy")
        self.assertIn("event", record)

    def test_oneLinePerRecord(self) -> None:
        """A field containing newlines stays on one line."""
        self.log.info("x", problem="a\nb")
        self.assertEqual(len(self.stream.getvalue().splitlines()), 1)

    def test_toRecordFailureDirect(self) -> None:
        """``toRecord`` of an event with a failure names the exception."""
        record = toRecord(
            {
                "log_level": LogLevel.error,
                "log_time": 2.0,
                "log_format": "x",
                "log_failure": Failure(ValueError("v")),
            }
        )
        self.assertEqual(record["exception"], "ValueError")
