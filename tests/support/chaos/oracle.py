"""The soak's oracle: whether one client answer is one the spec allows for the attempts it saw.

``classify`` names the answer (full, cut, passthrough, gen:<reason>, ...); ``judge`` checks it
against the engine-side attempts recorded for its chaos id and the discovery churn.

The attempts are judged in the order the proxy sent them (``sentOrder``), which is not
always the order the engines read them: when the soak's process is starved of CPU, a request
the proxy already gave up on (its header cap expired, its node left) can be read after the
next attempt's.  The kernel's arrival times order such attempts; an attempt read only after
the proxy gave up on it (``unanswered``) may fail whatever its engine then did.
"""

from __future__ import annotations

import json
from functools import cmp_to_key

from tests.support.chaos.records import Attempt, ChaosConfig, Sent
from tests.support.harness import CANARY

GENERATED_REASONS = {
    502: {"no_owner", "upstream_unreachable"},
    503: {
        "deadline_exceeded",
        "owner_unavailable",
        "attempts_exhausted",
        "queue_full",  # standalone: the queue (judged below)
        "queue_timeout",
    },
    504: {"no_content"},
}

# behaviour label -> what an attempt meeting it may become, unless its node left discovery:
# "full" (commits, complete answer), "cut" (commits, truncated), "status" (a retryable
# status: fails, or answers unchanged when final), "nocontent" (no first byte in time),
# "transport" (fails at the transport).
OUTCOMES: dict[str, set[str]] = {
    "answer": {"full"},
    "slow": {"full", "nocontent"},
    "slowlong": {"nocontent"},
    "hang": {"nocontent"},
    "s503": {"status"},
    "s429": {"status"},
    "die": {"cut", "transport"},
    "drop": {"transport"},
    "refuse": {"transport"},
}
# Verbatim requests are not gated: headers commit them.
VERBATIM_OUTCOMES: dict[str, set[str]] = {
    "answer": {"full"},
    "slow": {"full"},
    "s503": {"status"},
    "s429": {"status"},
    "die": {"cut", "transport"},
    "drop": {"transport"},
    "refuse": {"transport"},
}


# How far apart two kernel arrival times must be to order two attempts: the kernel keeps
# them in scheduler ticks (a few milliseconds), and they are read a little later.
ARRIVAL_SLACK = 0.02


def _sentBefore(a: Attempt, b: Attempt) -> bool:
    """Whether the proxy sent ``a`` before ``b``: by the kernel's arrival times when they are
    clearly apart; else a request the proxy had reset before it was read first (its node
    left just after it was sent, and the next attempt went out at once); else by the read
    order (right whenever one attempt's answer led to the next, as the next could only be
    read after that answer was written)."""
    if a.arrival is not None and b.arrival is not None:
        if abs(a.arrival - b.arrival) > ARRIVAL_SLACK:
            return a.arrival < b.arrival
    if a.abandoned != b.abandoned:
        return a.abandoned
    return a.seq < b.seq


def sentOrder(attempts: list[Attempt]) -> list[Attempt]:
    """The attempts in the order the proxy sent them."""

    def compare(a: Attempt, b: Attempt) -> int:
        return -1 if _sentBefore(a, b) else 1 if _sentBefore(b, a) else 0

    return sorted(attempts, key=cmp_to_key(compare))


def unanswered(a: Attempt, config: ChaosConfig) -> bool:
    """Whether the proxy may have given up on the attempt before its engine answered: the
    proxy had reset or closed the connection when the engine read the request, or the
    engine read it only once the header cap (which starts before the request is sent) may
    have run out."""
    if a.abandoned:
        return True
    if a.arrival is None or a.read is None:
        return False
    return a.read - a.arrival >= config.responseTimeout - ARRIVAL_SLACK


def _complete(s: Sent) -> bool:
    """Whether a 200 body is a whole answer of its route."""
    body = s.body
    try:
        if s.kind == "list":
            return isinstance(json.loads(body).get("models"), list)
        if s.kind == "verbatim":
            return "engine" in json.loads(body)
        if s.path.startswith("/api/"):
            lines = [json.loads(x) for x in body.splitlines() if x.strip()]
            return bool(lines) and lines[-1].get("done") is True
        if s.stream:
            return body.rstrip().endswith(b"data: [DONE]")
        return bool(json.loads(body)["choices"][0]["message"]["content"].startswith("tok"))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return False


def _generatedReason(s: Sent) -> str | None:
    try:
        doc = json.loads(s.body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("error"), dict):
        code = doc["error"].get("code")
        return code if isinstance(code, str) else None
    reason = doc.get("reason")
    return reason if isinstance(reason, str) else None


def classify(s: Sent) -> None:
    """Name the answer a request got: full, cut, passthrough, gen:<reason>, or other."""
    if s.error is not None:
        s.answer = "client-error"
    elif s.node is not None:
        if s.truncated:
            s.answer = "cut"
        elif s.status == 200:
            s.answer = "full" if _complete(s) else "incomplete-200"
        else:
            s.answer = "passthrough"
    elif s.kind == "list":
        s.answer = "full" if s.status == 200 and not s.truncated and _complete(s) else "bad-list"
    else:
        reason = _generatedReason(s)
        s.answer = f"gen:{reason}" if reason else f"unknown-{s.status}"


def judge(
    s: Sent, attempts: list[Attempt], config: ChaosConfig, churned: bool, wasEmpty: bool, fleet: int
) -> str | None:
    """Return why the answer ``s`` got is not one the spec allows for ``attempts``, or None.

    Also sets ``s.answer`` and ``s.state`` (the terminal workload state it implies).
    """
    classify(s)
    answer = s.answer
    if s.kind == "list":
        return None if answer == "full" else f"fleet list answered {s.status}"
    inference = s.kind == "inference"
    outcomes = OUTCOMES if inference else VERBATIM_OUTCOMES
    attempts = sentOrder(attempts)
    last = attempts[-1] if attempts else None

    def can(a: Attempt | None, what: str) -> bool:
        if a is None:
            return what == "transport"  # an unrecorded attempt: the connection was refused
        return what in outcomes.get(a.label, set()) or (churned and what == "left")

    if inference:
        s.state = "failed"
        if len(attempts) > config.maxAttempts:
            return f"{len(attempts)} dispatches > {config.maxAttempts}"
    else:
        engines = [a.engine for a in attempts]
        if len(set(engines)) != len(engines):
            return "non-inference request dispatched twice to one node"
        if len(engines) > fleet:
            return "non-inference request dispatched to more nodes than exist"
    # every attempt but the last must have failed (nothing commits twice)
    for a in attempts[:-1]:
        if unanswered(a, config):
            continue  # the proxy gave up on it: a header timeout, or its node left
        if not (can(a, "status") or can(a, "nocontent") or can(a, "transport") or can(a, "left")):
            return f"attempt {a.label} on {a.engine} could not have failed"
    if answer in ("full", "cut", "passthrough"):
        if last is None or last.engine != s.node:
            return "committed on a node that did not receive it last"
        if last.abandoned:
            return "committed on a request the proxy had reset before its engine read it"
        if s.attempts is not None and not (len(attempts) <= s.attempts <= config.maxAttempts):
            return f"x-nvpair-attempts {s.attempts} inconsistent with {len(attempts)} seen"
        if answer == "passthrough":
            if not can(last, "status") or f"s{s.status}" != last.label:
                return f"status {s.status} passed through from a {last.label} attempt"
            if inference and s.attempts != config.maxAttempts:
                return "a retryable status passed through before the final attempt"
            if CANARY.encode() not in s.body:
                return "passed-through body changed"
            return None
        if not can(last, answer):
            return f"{answer} answer from a {last.label} attempt"
        if inference:
            s.state = "completed"
        return None
    if answer.startswith("gen:"):
        reason = answer[4:]
        if reason not in GENERATED_REASONS.get(s.status or 0, set()):
            return f"generated {s.status} with reason {reason}"
        if s.status == 503 and s.retryAfter is None:
            return "generated 503 without Retry-After"
        if reason == "no_owner":
            if attempts:
                return "no_owner after a dispatch"
            if not (wasEmpty or (churned and not inference)):
                return "no_owner while owners were present"
            return None
        if reason == "attempts_exhausted":
            return "attempts_exhausted (the spec says unreachable)"
        if reason == "owner_unavailable":
            if not inference or not (churned or wasEmpty):
                return "owner_unavailable without any node leaving"
            return None
        if reason == "deadline_exceeded":
            if not inference or len(attempts) >= config.maxAttempts:
                return "deadline_exceeded after the whole budget was dispatched"
            if s.end - s.start < config.jobDeadline * 0.9:
                return f"deadline_exceeded after only {s.end - s.start:.2f}s"
            return None
        if reason in ("queue_full", "queue_timeout"):
            if not inference or not config.queue:
                return f"{reason} where no queue runs"
            return None
        if reason == "no_content":
            if not can(last, "nocontent"):
                return f"504 after a {last.label if last else 'refused'} final attempt"
            return None
        if reason == "upstream_unreachable":
            if can(last, "transport") or can(last, "left"):
                return None
            if last is not None and unanswered(last, config):
                return None  # its header cap ran out first
            if len(attempts) < (config.maxAttempts if inference else fleet):
                return None  # the final attempt was refused at connect (unrecorded)
            return f"502 after a {last.label if last else '?'} final attempt"
        return None
    return f"answer {answer} (status {s.status}, error {s.error})"
