"""Command-line options of ``twistd nvpair-proxy`` (protocol §1), with environment fallbacks.

A malformed value exits the process with status 2 and one line on stderr naming the
option; twistd's own usage path (usage on stdout, exit 1) is never reached.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from twisted.python import usage

from nvpair.proxy import tracing
from nvpair.proxy.engines import ENGINES
from nvpair.proxy.facade.fleetfile import FleetError, FleetSpec, loadFleet
from nvpair.proxy.facade.hostcheck import parseAllowedHosts
from nvpair.proxy.runtime.logs import logFormatFor, parseLogFormat, stderrIsTerminal
from nvpair.proxy.settings import LEVELS, Settings

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class OptionError(ValueError):
    """A malformed option value; ``option`` names the flag."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


def parseDuration(text: str) -> float:
    """Parse ``1.5``, ``250ms``, ``10s``, ``30m`` or ``2h`` into seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 1.5, 250ms, 10s, 30m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _parseInt(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{value} is out of range ({bound})")
    return value


AFFINITY_MODES = ("prefix", "off")


def _parseAffinity(text: str) -> str:
    mode = text.strip().lower()
    if mode not in AFFINITY_MODES:
        raise ValueError(f"unknown mode {text!r} (one of {', '.join(AFFINITY_MODES)})")
    return mode


def _parseLevel(text: str) -> str:
    level = text.strip().lower()
    if level == "warning":
        level = "warn"
    if level not in LEVELS:
        raise ValueError(f"unknown level {text!r} (one of {', '.join(LEVELS)})")
    return level


# (flag, env var, default text, parser, Settings field)
_VALUED: list[tuple[str, str | None, str | None, Callable[[str], object], str]] = [
    ("state-dir", "NVPAIR_STATE_DIR", "~/.nvpair", str, "stateDir"),
    ("cluster-dir", "NVPAIR_CLUSTER_DIR", None, str, "clusterDir"),
    (
        "response-header-timeout",
        "NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT",
        "30m",
        parseDuration,
        "responseHeaderTimeout",
    ),
    ("job-deadline", "NVPAIR_PROXY_JOB_DEADLINE", "10m", parseDuration, "jobDeadline"),
    ("dial-timeout", "NVPAIR_PROXY_DIAL_TIMEOUT", "10s", parseDuration, "dialTimeout"),
    (
        "max-dispatch-attempts",
        "NVPAIR_PROXY_MAX_DISPATCH_ATTEMPTS",
        "5",
        lambda t: _parseInt(t, 1),
        "maxDispatchAttempts",
    ),
    ("backoff-base", "NVPAIR_PROXY_BACKOFF_BASE", "250ms", parseDuration, "backoffBase"),
    ("backoff-max", "NVPAIR_PROXY_BACKOFF_MAX", "5s", parseDuration, "backoffMax"),
    (
        "client-write-timeout",
        "NVPAIR_PROXY_CLIENT_WRITE_TIMEOUT",
        "60s",
        parseDuration,
        "clientWriteTimeout",
    ),
    ("retry-after", "NVPAIR_PROXY_RETRY_AFTER", "10", lambda t: _parseInt(t, 0), "retryAfter"),
    ("max-body", "NVPAIR_PROXY_MAX_BODY", "67108864", lambda t: _parseInt(t, 0), "maxBody"),
    ("log-level", "NVPAIR_LOG_LEVEL", "info", _parseLevel, "logLevel"),
    ("ops-port", "NVPAIR_PROXY_OPS_PORT", None, lambda t: _parseInt(t, 0, 65535), "opsPort"),
    (
        "max-connections",
        "NVPAIR_PROXY_MAX_CONNECTIONS",
        "4096",
        lambda t: _parseInt(t, 1),
        "maxConnections",
    ),
    (
        "header-read-timeout",
        "NVPAIR_PROXY_HEADER_READ_TIMEOUT",
        "30s",
        parseDuration,
        "headerReadTimeout",
    ),
    (
        "max-header-bytes",
        "NVPAIR_PROXY_MAX_HEADER_BYTES",
        "65536",
        lambda t: _parseInt(t, 1024),
        "maxHeaderBytes",
    ),
    ("allowed-hosts", "NVPAIR_PROXY_ALLOWED_HOSTS", "", parseAllowedHosts, "allowedHosts"),
    (
        "stream-idle-timeout",
        "NVPAIR_PROXY_STREAM_IDLE_TIMEOUT",
        "5m",
        parseDuration,
        "streamIdleTimeout",
    ),
    ("affinity", "NVPAIR_PROXY_AFFINITY", "prefix", _parseAffinity, "affinity"),
    ("queue-max", "NVPAIR_PROXY_QUEUE_MAX", "256", lambda t: _parseInt(t, 0), "queueMax"),
    ("queue-timeout", "NVPAIR_PROXY_QUEUE_TIMEOUT", "30s", parseDuration, "queueTimeout"),
    ("log-format", "NVPAIR_LOG_FORMAT", None, parseLogFormat, "logFormat"),
]

_HELP = {
    "state-dir": "where persisted ports live [env NVPAIR_STATE_DIR]",
    "cluster-dir": "cluster membership and pins [env NVPAIR_CLUSTER_DIR]",
    "response-header-timeout": "header cap and first-content cap; 0 disables both "
    "[env NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT]",
    "job-deadline": "no new dispatch after this long [env NVPAIR_PROXY_JOB_DEADLINE]",
    "dial-timeout": "connect timeout per attempt [env NVPAIR_PROXY_DIAL_TIMEOUT]",
    "max-dispatch-attempts": "dispatches per inference request "
    "[env NVPAIR_PROXY_MAX_DISPATCH_ATTEMPTS]",
    "backoff-base": "first wait between rounds, doubling [env NVPAIR_PROXY_BACKOFF_BASE]",
    "backoff-max": "cap on the wait between rounds [env NVPAIR_PROXY_BACKOFF_MAX]",
    "client-write-timeout": "dead-client write deadline [env NVPAIR_PROXY_CLIENT_WRITE_TIMEOUT]",
    "retry-after": "Retry-After seconds on generated 503s [env NVPAIR_PROXY_RETRY_AFTER]",
    "max-body": "largest request body in bytes; larger get 413 [env NVPAIR_PROXY_MAX_BODY]",
    "log-level": "debug, info, warn or error [env NVPAIR_LOG_LEVEL]",
    "ops-port": "loopback operations listener port; 0 = off [env NVPAIR_PROXY_OPS_PORT] "
    "(default: off under a broker, 9464 standalone)",
    "max-connections": "client connections per facade before new ones are refused "
    "[env NVPAIR_PROXY_MAX_CONNECTIONS]",
    "header-read-timeout": "a client must finish sending its request headers within this "
    "[env NVPAIR_PROXY_HEADER_READ_TIMEOUT]",
    "max-header-bytes": "largest request header block; larger get 431 "
    "[env NVPAIR_PROXY_MAX_HEADER_BYTES]",
    "allowed-hosts": "extra Host names plaintext requests may use, comma-separated; "
    "* disables the check [env NVPAIR_PROXY_ALLOWED_HOSTS]",
    "stream-idle-timeout": "after commit, cut a stream whose engine sends nothing for this "
    "long; 0 = never [env NVPAIR_PROXY_STREAM_IDLE_TIMEOUT]",
    "affinity": "prefix or off: keep a conversation on the node that served it "
    "(standalone mode) [env NVPAIR_PROXY_AFFINITY]",
    "queue-max": "standalone: requests per facade and model that may wait in the proxy while "
    "every owner is full; 0 = no queue [env NVPAIR_PROXY_QUEUE_MAX]",
    "queue-timeout": "standalone: longest wait in that queue [env NVPAIR_PROXY_QUEUE_TIMEOUT]",
    "log-format": "json or text; default text when stderr is a terminal (standalone), json "
    "otherwise; a broker always gets json [env NVPAIR_LOG_FORMAT]",
}

STANDALONE_OPS_PORT = 9464


def _fail(option: str, message: str) -> None:
    """Report a malformed option the contract's way: one stderr line, exit status 2."""
    sys.stderr.write(f"nvpair-proxy: --{option}: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


class Options(usage.Options):
    """The options of protocol §1; ``settings`` holds the validated result."""

    synopsis = "[options]"
    longdesc = "Run the nvpair engine proxy: one HTTP facade per enabled inference engine."

    optFlags = [
        ["standalone", None, "run without a broker (protocol §9)"],
        [
            "otel",
            None,
            "export OpenTelemetry traces, configured by OTEL_* "
            "[env NVPAIR_PROXY_OTEL] (needs the otel extra)",
        ],
    ]
    optParameters = [[flag, None, None, _HELP[flag]] for flag, *_ in _VALUED] + [
        [
            "fleet",
            None,
            None,
            "standalone: the fleet file (TOML), reloaded on SIGHUP and when "
            "it changes [env NVPAIR_PROXY_FLEET]",
        ],
        ["check-fleet", None, None, "validate a fleet file and exit: 0, or 2 with the problem"],
    ]

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.backends: list[tuple[str, str]] = []
        self.enginesList: tuple[str, ...] | None = None
        self.settings: Settings | None = None
        self.fleetSpec: FleetSpec | None = None

    def opt_backend(self, value: str) -> None:
        """standalone local engine address ENGINE=URL, repeatable"""
        engine, sep, url = value.partition("=")
        engine = engine.strip()
        url = url.strip()
        if not sep or engine not in ENGINES:
            _fail("backend", f"expected ENGINE=URL with ENGINE one of {', '.join(ENGINES)}")
        if not (url.startswith("http://") and len(url) > len("http://")):
            _fail("backend", "URL must start with http://")
        self.backends.append((engine, url.rstrip("/")))

    def opt_engines(self, value: str) -> None:
        """standalone: comma-separated facades to enable (default all three)"""
        names = tuple(n.strip() for n in value.split(",") if n.strip())
        unknown = [n for n in names if n not in ENGINES]
        if not names or unknown:
            _fail("engines", f"expected a comma-separated list of {', '.join(ENGINES)}")
        self.enginesList = tuple(dict.fromkeys(names))

    def parseOptions(self, options: Sequence[str] | None = None) -> None:
        try:
            super().parseOptions(options)
        except usage.UsageError as e:
            sys.stderr.write(f"nvpair-proxy: {e}\n")
            sys.stderr.flush()
            raise SystemExit(2) from None

    def _fleet(self, standalone: bool) -> str | None:
        """The fleet file's absolute path, validated (else exit 2 with its one line), or None."""
        path: str | None = self["fleet"]
        source = "fleet"
        if path is None and standalone and self.environ.get("NVPAIR_PROXY_FLEET", ""):
            path, source = self.environ["NVPAIR_PROXY_FLEET"], "fleet (from NVPAIR_PROXY_FLEET)"
        if path is None:
            return None
        if not standalone:
            _fail("fleet", "only meaningful with --standalone")
        if self.backends or self.enginesList is not None:
            _fail(source, "--backend and --engines may not be given with a fleet file")
        path = os.path.abspath(os.path.expanduser(path))
        try:
            self.fleetSpec = loadFleet(path)
        except FleetError as e:
            _fail(source, str(e))
        return path

    def postOptions(self) -> None:
        checked = self["check-fleet"]
        if checked is not None:  # validate and exit: nothing starts
            try:
                summary = loadFleet(checked).summary()
            except FleetError as e:
                _fail("check-fleet", str(e))
            sys.stdout.write(f"{checked}: {summary}\n")
            sys.stdout.flush()
            raise SystemExit(0)
        # Settings' fields by name; each parser's result has its field's type.
        values: dict[str, object] = {}
        for flag, env, default, parse, field in _VALUED:
            text = self[flag]
            source = flag
            if text is None and env is not None and self.environ.get(env, "") != "":
                text = self.environ[env]
                source = f"{flag} (from {env})"
            if text is None:
                text = default
            if text is None:
                values[field] = None
                continue
            try:
                values[field] = parse(text)
            except ValueError as e:
                _fail(source, str(e))
        values["stateDir"] = os.path.expanduser(cast(str, values["stateDir"]))
        standalone = bool(self["standalone"])
        opsPort = values["opsPort"]
        if opsPort is None and standalone:
            opsPort = STANDALONE_OPS_PORT
        if opsPort == 0:
            opsPort = None
        values["opsPort"] = opsPort
        if self.backends and not standalone:
            _fail("backend", "only meaningful with --standalone")
        logFormat = cast("str | None", values["logFormat"])
        values["logFormat"] = logFormatFor(logFormat, standalone, stderrIsTerminal())
        otel = (
            bool(self["otel"]) or self.environ.get("NVPAIR_PROXY_OTEL", "").lower() in tracing.TRUE
        )
        if otel and not tracing.available():
            _fail("otel", "OpenTelemetry is not installed: pip install 'nvpair-proxy[otel]'")
        values["otel"] = otel
        fleetFile = self._fleet(standalone)
        engines = self.fleetSpec.engines if self.fleetSpec else self.enginesList
        self.settings = Settings(
            standalone=standalone,
            backends=tuple(self.backends),
            engines=engines or tuple(ENGINES),
            fleetFile=fleetFile,
            # Each value is its ``_VALUED`` parser's result, of its field's type (checked by
            # tests/process/test_options.py); the table cannot say so to mypy.
            **values,  # type: ignore[arg-type]
        )
