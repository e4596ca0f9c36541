"""Log lines for people (``--log-format text``): the same records, one readable line each."""

from __future__ import annotations

import io
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.options import Options
from nvpair.proxy.runtime.logoutlet import LineOutlet
from nvpair.proxy.runtime.logs import (
    LogControl,
    jsonLine,
    logFormatFor,
    makeObserver,
    textLine,
    textValue,
)

SCALARS = st.one_of(
    st.text(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=8,
)


class TextLineTests(SynchronousTestCase):
    """The text rendering of one record."""

    def test_shape(self) -> None:
        """Time (UTC, milliseconds), level, event, engine, then the fields in order; plain
        values bare, others quoted as JSON strings."""
        line = textLine(
            {
                "time": 1767225600.25,
                "level": "warn",
                "component": "nvpair-proxy",
                "engine": "ollama",
                "event": "facade-problem",
                "kind": "alias",
                "problem": 'port 11434 is "taken"',
                "port": 11435,
                "aliases": [11434],
                "empty": "",
                "nothing": None,
            }
        )
        self.assertEqual(
            line,
            "2026-01-01T00:00:00.250Z WARN  facade-problem engine=ollama kind=alias "
            'problem="port 11434 is \\"taken\\"" port=11435 aliases="[11434]" empty="" '
            "nothing=null",
        )

    def test_noTime(self) -> None:
        """A record without a usable time still gets a line, with ``-`` for the time."""
        self.assertEqual(textLine({"level": "info", "event": "x"}), "- INFO  x")

    def test_quotedRoundTrip(self) -> None:
        """A quoted string value reads back as itself (JSON string syntax)."""
        for text in ("a b", "x=y", "line\nbreak", "tab\there", "é ü", "\u2028", ""):
            rendered = textValue(text)
            self.assertEqual(json.loads(rendered), text)

    @given(st.dictionaries(st.text(), VALUES, max_size=6), VALUES, st.text())
    def test_oneLine(self, fields: dict[str, Any], engine: Any, event: str) -> None:
        """Whatever the fields hold (line breaks of every kind included): exactly one line,
        naming every field."""
        record: dict[str, object] = {"time": 1.5, "level": "info", "event": event}
        record["engine"] = engine
        record.update(fields)
        line = textLine(record)
        self.assertEqual(len(line.splitlines()), 1, line)
        self.assertNotIn("\n", line)
        for key in fields:
            if key not in ("time", "level", "component", "event", "engine"):
                self.assertIn(f" {textValue(key)}=", line)


class TextObserverTests(SynchronousTestCase):
    """The process's observer in text form."""

    def test_sameRecords(self) -> None:
        """The text observer writes the same records, one line each, failures included."""
        stream = io.StringIO()
        log = Logger(
            namespace="nvpair.proxy.test",
            observer=makeObserver(stream, LogControl("info"), "text"),
        )
        log.info("facade-enabled", engine="ollama", port=11435)
        log.debug("hidden", engine="ollama")
        try:
            raise ValueError("boom")
        except ValueError:
            log.failure("request-crashed", Failure(), engine="ollama")
        lines = stream.getvalue().split("\n")
        self.assertEqual(lines[-1], "")
        first, second = lines[:-1]
        self.assertRegex(first, r"^\S+Z INFO  facade-enabled engine=ollama port=11435$")
        self.assertIn(
            " ERROR request-crashed engine=ollama exception=ValueError traceback=", second
        )

    def test_droppedRecordInText(self) -> None:
        """The outlet's dropped-lines record comes in the outlet's format."""
        stream = io.StringIO()
        runs: list[Any] = []
        outlet = LineOutlet(
            stream, "nvpair-proxy", 4, start=runs.append, clock=lambda: 0.0, render=textLine
        )
        outlet.write("abc\n")
        outlet.write("too long\n")
        outlet.drain(block=False)
        self.assertEqual(
            stream.getvalue(), "abc\n1970-01-01T00:00:00.000Z WARN  log-lines-dropped count=1\n"
        )


class FormatChoiceTests(SynchronousTestCase):
    """Which format a process writes (protocol §10)."""

    def test_default(self) -> None:
        """Standalone: text on a terminal, JSON otherwise; asked, as asked; under a broker
        JSON whatever is asked."""
        self.assertEqual(logFormatFor(None, True, True), "text")
        self.assertEqual(logFormatFor(None, True, False), "json")
        self.assertEqual(logFormatFor("json", True, True), "json")
        self.assertEqual(logFormatFor("text", True, False), "text")
        self.assertEqual(logFormatFor("text", False, True), "json")
        self.assertEqual(logFormatFor(None, False, True), "json")

    def test_options(self) -> None:
        """``--log-format`` and ``NVPAIR_LOG_FORMAT`` (the flag wins); a bad value exits 2."""
        o = Options(environ={"NVPAIR_LOG_FORMAT": "text"})
        o.parseOptions(["--standalone"])
        assert o.settings is not None
        self.assertEqual(o.settings.logFormat, "text")
        o = Options(environ={"NVPAIR_LOG_FORMAT": "text"})
        o.parseOptions(["--standalone", "--log-format", "JSON"])
        assert o.settings is not None
        self.assertEqual(o.settings.logFormat, "json")
        o = Options(environ={})
        o.parseOptions(["--log-format", "text"])
        assert o.settings is not None
        self.assertEqual(o.settings.logFormat, "json", "a broker always gets JSON")
        stderr = io.StringIO()
        self.patch(__import__("sys"), "stderr", stderr)
        with self.assertRaises(SystemExit) as exit:
            Options(environ={}).parseOptions(["--standalone", "--log-format", "yaml"])
        self.assertEqual(exit.exception.code, 2)
        self.assertIn("--log-format", stderr.getvalue())


# Every character a terminal or a line splitter acts on: C0, DEL, C1, U+2028 and U+2029.
CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)]
CONTROL_TEXT = st.text(st.sampled_from(CONTROLS) | st.characters(), max_size=40)


def rawControls(line: str) -> list[str]:
    """The control characters left raw in a rendered line."""
    return [c for c in line if c in CONTROLS]


class ControlCharacterTests(SynchronousTestCase):
    """No control character reaches a log line raw, in either format (spec §9, issue 32)."""

    def test_csiAndOsc(self) -> None:
        """An 8-bit CSI and OSC, a 7-bit ESC sequence, BEL and DEL in a field, its key and
        the event are escaped in both formats; the JSON line reads back the same record."""
        hostile = "evil\x9b31m\x9d0;title\x9c\x1b[2J\x07\x7f\x85\u2028.example"
        record: dict[str, object] = {
            "time": 1.5,
            "level": "warn",
            "event": "host-denied" + hostile,
            "engine": "ollama",
            "host": hostile,
            "k" + hostile: [hostile],
        }
        jsonText = jsonLine(record)
        self.assertEqual(rawControls(jsonText), [])
        self.assertEqual(json.loads(jsonText), record)
        self.assertIn("\\u009b31m\\u009d0;title\\u009c\\u001b[2J\\u0007\\u007f", jsonText)
        text = textLine(record)
        self.assertEqual(rawControls(text), [])
        self.assertIn('host="evil\\u009b31m\\u009d0;title\\u009c', text)

    @given(st.dictionaries(CONTROL_TEXT, CONTROL_TEXT, max_size=4), CONTROL_TEXT, CONTROL_TEXT)
    def test_noneRaw(self, fields: dict[str, str], engine: str, event: str) -> None:
        """Whatever strings a record holds: no control character in its JSON or text line,
        and the JSON line parses back to the record."""
        record: dict[str, object] = {"time": 1.5, "level": "info", "event": event}
        record["engine"] = engine
        record.update(fields)
        jsonText = jsonLine(record)
        self.assertEqual(rawControls(jsonText), [])
        self.assertEqual(json.loads(jsonText), record)
        self.assertEqual(rawControls(textLine(record)), [])

    def test_observers(self) -> None:
        """Both observers of the process write the escaped line."""
        for form in ("json", "text"):
            stream = io.StringIO()
            log = Logger(observer=makeObserver(stream, LogControl("info"), form))
            log.warn("host-denied", host="a\x9bb\u2029c")
            self.assertEqual(rawControls(stream.getvalue().rstrip("\n")), [], form)
            self.assertIn("a\\u009bb\\u2029c", stream.getvalue(), form)
