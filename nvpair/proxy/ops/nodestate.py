"""Whether each node looks up, down or unknown, and why, for the operations page.

In standalone mode the evidence is the facade's inventory poll (its last result and when).
Under a broker a node is listed by discovery and judged by this process's last attempt on
it: one that committed, or that answered a status, reached a live engine; one that failed at
the transport or timed out did not.  Evidence older than the history window (15 minutes)
no longer counts: the node is then ``unknown`` again.
"""

from __future__ import annotations

from typing import Any

from nvpair.proxy.ops.history import BUCKET_SECONDS, BUCKETS

UP = "up"
DOWN = "down"
UNKNOWN = "unknown"
STALE_AFTER = BUCKET_SECONDS * BUCKETS

_ATTEMPT_DOWN = {
    "transport": "last attempt could not reach the engine",
    "header_timeout": "last attempt got no response headers in time",
    "no_content": "last attempt got no first token in time",
}

# The poller names a failure by its exception type; the common ones in words.
_POLL_PROBLEMS = {
    "ConnectError": "could not connect",
    "ConnectionRefusedError": "connection refused",
    "TimeoutError": "no answer in time",
    "DNSLookupError": "name not found",
    "ResponseFailed": "connection lost",
}


def pollHealth(poll: tuple[float, str] | None, models: int) -> tuple[str, str, float | None]:
    """(state, reason, when) from the last inventory poll of a standalone engine."""
    if poll is None:
        return UNKNOWN, "inventory poll pending", None
    when, problem = poll
    if problem:
        return DOWN, f"inventory poll failed: {_POLL_PROBLEMS.get(problem, problem)}", when
    plural = "" if models == 1 else "s"
    return UP, f"inventory poll answered: {models} model{plural}", when


def attemptHealth(
    attempt: tuple[float, str | None, int | None] | None, now: float
) -> tuple[str, str, float | None]:
    """(state, reason, when) from this process's last attempt on a discovered node."""
    if attempt is None:
        return UNKNOWN, "listed by discovery, not tried yet", None
    when, kind, status = attempt
    if kind is None:
        state, reason = UP, "last attempt served"
    elif kind in _ATTEMPT_DOWN:
        state, reason = DOWN, _ATTEMPT_DOWN[kind]
    else:
        state, reason = UP, f"last attempt answered status {status}"
    if now - when > STALE_AFTER:
        return UNKNOWN, f"no attempt in the last 15 min ({reason})", when
    return state, reason, when


def nodeHealth(service: Any, engineId: str, node: Any, now: float) -> dict[str, Any]:
    """The ``state``, ``stateReason`` and ``checkedAt`` (ms or None) of one facade node."""
    poller = _poller(service, engineId)
    if poller is not None and node.id in poller.urls:
        state, reason, when = pollHealth(poller.polls.get(node.id), len(node.models))
    else:
        state, reason, when = attemptHealth(
            service.reporter.history.attempts.get((engineId, node.id)), now
        )
    return {
        "state": state,
        "stateReason": reason,
        "checkedAt": None if when is None else int(when * 1000),
    }


def _poller(service: Any, engineId: str) -> Any:
    """The standalone inventory poller of a facade, if the process runs one."""
    if not service.settings.standalone:
        return None
    try:
        return service.getServiceNamed(f"standalone-{engineId}")
    except KeyError:
        return None
