"""Log lines on stderr (protocol §10) with a level switchable at runtime.

Every record is one JSON object: ``time``, ``level``, ``component`` (always
``nvpair-proxy``), ``engine`` for facade records, ``event`` and operational fields.  With
``--log-format text`` the same record is one line for people (``textLine``): time, level,
event, engine, then ``key=value`` fields.  Code logs operational metadata only; nothing
here inspects or adds request content.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogEvent,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
)
from zope.interface import implementer

from nvpair.proxy.logswitch import ILogControl

COMPONENT = "nvpair-proxy"

_TO_TWISTED = {
    "debug": LogLevel.debug,
    "info": LogLevel.info,
    "warn": LogLevel.warn,
    "error": LogLevel.error,
}
_FROM_TWISTED = {
    LogLevel.debug: "debug",
    LogLevel.info: "info",
    LogLevel.warn: "warn",
    LogLevel.error: "error",
    LogLevel.critical: "error",
}
_ORDER = {"debug": 0, "info": 1, "warn": 2, "error": 3}

# Keys of legacy/twisted events that are framing, not operational fields.
_SKIP = frozenset(
    ("format", "message", "isError", "system", "time", "why", "failure", "printed", "log_trace")
)


class TextStream(Protocol):
    """Where log lines go: stderr itself, or ``logoutlet.LineOutlet`` in front of it."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


@implementer(ILogControl)
class LogControl:
    """The active log level, shared by the observer and by code that wants to skip work."""

    def __init__(self, level: str = "info") -> None:
        self.predicate = LogLevelFilterPredicate(defaultLogLevel=_TO_TWISTED[level])
        self.level = level

    def setLevel(self, level: str) -> None:
        """Change the level; takes effect for the next record."""
        self.level = level
        self.predicate.setLogLevelForNamespace("", _TO_TWISTED[level])

    def enabled(self, level: str) -> bool:
        """Whether a record at ``level`` would be written (cheap; use before costly logging)."""
        return _ORDER[level] >= _ORDER[self.level]


def toRecord(event: LogEvent) -> dict[str, object]:
    """Turn a Twisted log event into the protocol's JSON record."""
    level = event.get("log_level", LogLevel.info)
    record: dict[str, object] = {
        "time": event.get("log_time"),
        "level": _FROM_TWISTED.get(level, "info"),
        "component": COMPONENT,
    }
    text = event.get("log_format")
    if text is not None and "{" not in text:
        record["event"] = text
    else:
        record["event"] = formatEvent(event)
    for key, value in event.items():
        if key.startswith("log_") or key in _SKIP:
            continue
        record[key] = value
    failure = event.get("log_failure")
    if failure is not None:
        record["exception"] = failure.type.__name__ if failure.type else "unknown"
        record["traceback"] = failure.getTraceback()
    return record


# The control characters JSON leaves unescaped: DEL, the C1 range (8-bit CSI, OSC, NEL...)
# and the two Unicode line breaks; JSON escapes every C0 character itself.
_CONTROLS = re.compile("[\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escapeControls(text: str) -> str:
    """``text`` (JSON) with every DEL, C1 and U+2028/U+2029 written as a ``\\u`` escape:
    the same JSON value, and nothing a terminal or a line splitter acts on (spec §9)."""
    return _CONTROLS.sub(_escape, text) if _CONTROLS.search(text) else text


def jsonLine(record: dict[str, object]) -> str:
    """A record as its JSON line (without the newline); no control character is left raw."""
    return escapeControls(json.dumps(record, default=str, ensure_ascii=False))


# A value written bare in a text line; anything else is quoted (JSON string syntax).
_BARE = re.compile(r"[A-Za-z0-9_.,:/@+\-]+")
_HEAD = ("time", "level", "component", "event", "engine")


def textValue(value: object) -> str:
    """One field value of a text line: bare when plain, else quoted with escapes (every
    control character included)."""
    if isinstance(value, str):
        if _BARE.fullmatch(value):
            return value
        return escapeControls(json.dumps(value, ensure_ascii=False))
    text = json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))
    if _BARE.fullmatch(text):
        return text
    return escapeControls(json.dumps(text, ensure_ascii=False))


def textLine(record: dict[str, object]) -> str:
    """A record as one line for people (without the newline): UTC time with milliseconds,
    level, event, ``engine=`` when present, then the other fields as ``key=value``."""
    when = record.get("time")
    if isinstance(when, int | float):
        stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    else:
        stamp = "-"
    level = str(record.get("level", "info")).upper()
    parts = [stamp, f"{level:<5}", textValue(str(record.get("event", "")))]
    if "engine" in record:
        parts.append(f"engine={textValue(record['engine'])}")
    for key, value in record.items():
        if key not in _HEAD:
            parts.append(f"{textValue(key)}={textValue(value)}")
    return " ".join(parts)


FORMATS: dict[str, Callable[[dict[str, object]], str]] = {"json": jsonLine, "text": textLine}


def parseLogFormat(text: str) -> str:
    """``--log-format``: json or text (any case)."""
    form = text.strip().lower()
    if form not in FORMATS:
        raise ValueError(f"unknown format {text!r} (one of {', '.join(FORMATS)})")
    return form


def logFormatFor(asked: str | None, standalone: bool, terminal: bool) -> str:
    """The log format: JSON under a broker whatever is asked (its pipe always gets JSON,
    protocol §10); standalone, the one asked, else text on a terminal and JSON otherwise."""
    if not standalone:
        return "json"
    if asked is not None:
        return asked
    return "text" if terminal else "json"


def stderrIsTerminal() -> bool:
    """Whether the process's stderr is a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@implementer(ILogObserver)
class LineObserver:
    """Write each event as one line, JSON or text, to a text stream (stderr in production)."""

    def __init__(self, stream: TextStream, render: Callable[[dict[str, object]], str]) -> None:
        self._stream = stream
        self._render = render

    def __call__(self, event: LogEvent) -> None:
        try:
            line = self._render(toRecord(event))
        except Exception:
            line = self._render(
                {
                    "time": event.get("log_time"),
                    "level": "error",
                    "component": COMPONENT,
                    "event": "unserializable log event",
                }
            )
        self._stream.write(line + "\n")
        self._stream.flush()


class JSONLineObserver(LineObserver):
    """Write each event as one JSON line to a text stream."""

    def __init__(self, stream: TextStream) -> None:
        super().__init__(stream, jsonLine)


def makeObserver(stream: TextStream, control: LogControl, form: str = "json") -> ILogObserver:
    """The process's log observer: lines in ``form`` (json or text) to ``stream``, filtered
    by ``control``."""
    return FilteringLogObserver(LineObserver(stream, FORMATS[form]), [control.predicate])
