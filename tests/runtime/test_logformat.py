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
from nvpair.proxy.runtime.logs import LogControl, logFormatFor, makeObserver, textLine, textValue

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
