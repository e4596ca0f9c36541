"""The queue and the breakers on the operations page (standalone): a tile per facade with
the depth and last wait of each model's queue, a breaker note under a node's state.  The
live script (``static/ops.js``: ``queueTile``, ``breakerNote``) draws the same."""

from __future__ import annotations

from collections.abc import Mapping

from nvpair.proxy.ops.documents import StatusDocument
from nvpair.proxy.ops.format import esc, number, seconds


def _queueing(status: StatusDocument) -> Mapping[str, object] | None:
    queueing = status.get("queueing")
    return queueing if isinstance(queueing, dict) else None


def queueTile(status: StatusDocument, engineId: str) -> str:
    """The facade's queue tile: requests waiting now, and per model its depth and last
    wait; requests held for their prefix holder (placement's holds: held now, let out with
    a slot, recomputed elsewhere) once there were any; with declared clients, each client
    label's waiting, served and refused; nothing under a broker."""
    queueing = _queueing(status)
    if queueing is None:
        return ""
    allQueues = queueing.get("queues")
    queues = allQueues.get(engineId) if isinstance(allQueues, dict) else None
    if not isinstance(queues, dict):
        queues = {}
    total = 0
    parts = []
    for model in sorted(queues):
        entry: dict[str, float] = queues[model]
        depth = entry["depth"]
        total += int(depth)
        parts.append(
            f"{model} {number(depth)} waiting, last wait {seconds(entry['lastWaitSeconds'])}"
        )
    held = queueing.get("held")
    if isinstance(held, dict) and any(held.values()):
        parts.append(
            f"held for a prefix {number(held['now'])} now, {number(held['endedWithRoom'])} "
            f"got its slot, {number(held['endedWithBudget'])} recomputed"
        )
    parts.extend(_clientParts(queueing, engineId))
    detail = " \u00b7 ".join(parts) or "nobody waits"
    return (
        f'<div class="tile queue"><div class="tlabel">queue</div>'
        f'<div class="tval">{number(total)}</div><div class="tsub">{esc(detail)}</div></div>'
    )


def _clientParts(queueing: Mapping[str, object], engineId: str) -> list[str]:
    """Per client label of the facade (declared names, ``unverified``, ``other``), when
    clients are declared: ``ide 2 waiting, 40 served[, 1 refused]``."""
    declared = queueing.get("declaredClients")
    allClients = queueing.get("clients")
    clients = allClients.get(engineId) if isinstance(allClients, dict) else None
    if not declared or not isinstance(clients, dict):
        return []
    parts = []
    for label in sorted(clients):
        entry = clients[label]
        refused = sum(entry["refused"].values())
        text = f"{label} {number(entry['waiting'])} waiting, {number(entry['dispatched'])} served"
        parts.append(text + (f", {number(refused)} refused" if refused else ""))
    return parts


def breakerNote(status: StatusDocument, nodeId: str) -> str:
    """A node's breaker, when it has failed recently or is not closed."""
    queueing = _queueing(status)
    breakers = queueing.get("breakers") if queueing is not None else None
    entry = breakers.get(nodeId) if isinstance(breakers, dict) else None
    if not isinstance(entry, dict):
        return ""
    state = str(entry["state"])
    text = f"breaker {state} \u00b7 opened {number(entry['opens'])}\u00d7"
    return f'<div class="breaker {esc(state)}">{esc(text)}</div>'
