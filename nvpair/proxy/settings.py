"""The validated configuration every component reads (``options`` parses it).

A leaf module: the request context's interface names ``Settings`` as a type, and every
package reads it, so it imports nothing of the proxy.
"""

from __future__ import annotations

import attrs

LEVELS = ("debug", "info", "warn", "error")


@attrs.frozen
class Settings:
    """The validated configuration every component reads."""

    stateDir: str
    clusterDir: str | None
    responseHeaderTimeout: float
    jobDeadline: float
    dialTimeout: float
    maxDispatchAttempts: int
    backoffBase: float
    backoffMax: float
    clientWriteTimeout: float
    retryAfter: int
    maxBody: int
    logLevel: str
    opsPort: int | None
    standalone: bool
    backends: tuple[tuple[str, str], ...]
    engines: tuple[str, ...]
    maxConnections: int
    headerReadTimeout: float
    maxHeaderBytes: int
    allowedHosts: tuple[str, ...] = ()
    streamIdleTimeout: float = 300.0
    affinity: str = "prefix"
    fleetFile: str | None = None
    """Standalone: the fleet file's absolute path (validated at start; reloaded live)."""
    queueMax: int = 256
    queueTimeout: float = 30.0
    # Traces and log lines for people (spec §9, "Traces").
    otel: bool = False
    logFormat: str = "json"
