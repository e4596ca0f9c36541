"""Whether each node looks up, down or unknown, and why, for the operations page.

In standalone mode the evidence is the facade's inventory poll (its last result and when).
Under a broker a node is listed by discovery and judged by this process's last attempt on
it: one that committed, or that answered a status, reached a live engine; one that failed at
the transport or timed out did not.  Evidence older than the history window (15 minutes)
no longer counts: the node is then ``unknown`` again.
"""

from __future__ import annotations

from enum import Enum

from nvpair.proxy.facade.standalone import FleetPoller
from nvpair.proxy.ops.history import BUCKET_SECONDS, BUCKETS
from nvpair.proxy.ops.interfaces import IOpsView
from nvpair.proxy.routing.nodes import Node


class NodeState(Enum):
    """How a node looks to this process; the value is what ``/status`` shows."""

    UP = "up"
    DOWN = "down"
    UNKNOWN = "unknown"


# (state, reason in words, when the evidence was gathered or None)
Health = tuple[NodeState, str, float | None]

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


def pollHealth(poll: tuple[float, str] | None, models: int) -> Health:
    """(state, reason, when) from the last inventory poll of a standalone engine."""
    if poll is None:
        return NodeState.UNKNOWN, "inventory poll pending", None
    when, problem = poll
    if problem:
        return (
            NodeState.DOWN,
            f"inventory poll failed: {_POLL_PROBLEMS.get(problem, problem)}",
            when,
        )
    plural = "" if models == 1 else "s"
    return NodeState.UP, f"inventory poll answered: {models} model{plural}", when


def attemptHealth(attempt: tuple[float, str | None, int | None] | None, now: float) -> Health:
    """(state, reason, when) from this process's last attempt on a discovered node."""
    if attempt is None:
        return NodeState.UNKNOWN, "listed by discovery, not tried yet", None
    when, kind, status = attempt
    if kind is None:
        state, reason = NodeState.UP, "last attempt served"
    elif kind in _ATTEMPT_DOWN:
        state, reason = NodeState.DOWN, _ATTEMPT_DOWN[kind]
    else:
        state, reason = NodeState.UP, f"last attempt answered status {status}"
    if now - when > STALE_AFTER:
        return NodeState.UNKNOWN, f"no attempt in the last 15 min ({reason})", when
    return state, reason, when


def nodeHealth(view: IOpsView, engineId: str, node: Node, now: float) -> Health:
    """The state of one facade node: by its inventory poll where a standalone poller polls
    it, else by this process's last attempt on it."""
    poller = _poller(view, engineId)
    if poller is not None and node.id in poller.urls:
        return pollHealth(poller.polls.get(node.id), len(node.models))
    if poller is not None and node.id in poller.draining:
        return NodeState.UNKNOWN, "removed from the fleet file: finishing its requests", None
    return attemptHealth(view.context.history.attempts.get((engineId, node.id)), now)


def _poller(view: IOpsView, engineId: str) -> FleetPoller | None:
    """The standalone inventory poller of a facade, if the process runs one."""
    if not view.settings.standalone:
        return None
    try:
        poller = view.getServiceNamed(f"standalone-{engineId}")
    except KeyError:
        return None
    return poller if isinstance(poller, FleetPoller) else None
