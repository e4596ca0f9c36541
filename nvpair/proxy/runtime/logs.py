"""JSON log lines on stderr (protocol §10) with a level switchable at runtime.

Every record is one JSON object: ``time``, ``level``, ``component`` (always
``nvpair-proxy``), ``engine`` for facade records, ``event`` and operational fields.  Code
logs operational metadata only; nothing here inspects or adds request content.
"""

from __future__ import annotations

import json
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

from nvpair.proxy.interfaces import ILogControl

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


@implementer(ILogObserver)
class JSONLineObserver:
    """Write each event as one JSON line to a text stream (stderr in production)."""

    def __init__(self, stream: TextStream) -> None:
        self._stream = stream

    def __call__(self, event: LogEvent) -> None:
        try:
            line = json.dumps(toRecord(event), default=str, ensure_ascii=False)
        except Exception:
            line = json.dumps(
                {
                    "time": event.get("log_time"),
                    "level": "error",
                    "component": COMPONENT,
                    "event": "unserializable log event",
                }
            )
        self._stream.write(line + "\n")
        self._stream.flush()


def makeObserver(stream: TextStream, control: LogControl) -> ILogObserver:
    """The process's log observer: JSON lines to ``stream``, filtered by ``control``."""
    return FilteringLogObserver(JSONLineObserver(stream), [control.predicate])
