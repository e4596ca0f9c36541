"""The end of a soak: process probes, the report, and the checks over the whole run.

Every answer judged by the oracle, one terminal workload event per workload matching the
answers, and the canary nowhere in logs, JSON-RPC messages or generated error bodies.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import attrs

from tests.support.chaos.engine import ChaosEngine
from tests.support.chaos.oracle import judge
from tests.support.chaos.records import ChaosConfig, Ledger, Sent
from tests.support.harness import CANARY, ProxyFixture


def proxyPid(proxy: ProxyFixture) -> int:
    """The proxy process's pid."""
    pid = proxy.process.pid
    assert pid is not None
    return pid


def openFds(pid: int) -> int:
    """How many descriptors the process has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rssKiB(pid: int) -> int:
    """The process's resident set size in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@attrs.define
class Report:
    """The figures and violations of one soak run."""

    figures: dict[str, Any] = attrs.field(factory=dict)
    violations: list[str] = attrs.field(factory=list)
    answers: Counter[str] = attrs.field(factory=Counter)
    behaviours: Counter[str] = attrs.field(factory=Counter)

    def text(self) -> str:
        """A printable summary."""
        lines = ["chaos soak figures:"]
        for k, v in self.figures.items():
            lines.append(f"  {k}: {v}")
        lines.append("  answers: " + ", ".join(f"{k}={v}" for k, v in sorted(self.answers.items())))
        lines.append(
            "  engine behaviours: "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.behaviours.items()))
        )
        lines.append(f"  violations: {len(self.violations)}")
        for v in self.violations[:30]:
            lines.append(f"    {v}")
        return "\n".join(lines)


class SoakChecks:
    """The end-of-run checks of a soak over what it sent and saw (a mixin of ``Soak``)."""

    config: ChaosConfig
    ledger: Ledger
    engines: list[ChaosEngine]
    sent: list[Sent]
    removals: list[float]
    empty: list[tuple[float, float]]
    proxy: ProxyFixture | None
    report: Report

    def churned(self, s: Sent) -> bool:
        """Whether a node left discovery during this request's life (with some slack)."""
        return any(s.start - 0.3 <= t <= s.end + 0.3 for t in self.removals)

    def wasEmpty(self, s: Sent) -> bool:
        """Whether discovery was empty at some point during this request's life."""
        return any(a - 0.3 <= s.end and s.start <= b + 0.3 for a, b in self.empty)

    def checkAnswers(self) -> None:
        """Judge every answer against its attempts; count them."""
        for s in self.sent:
            attempts = self.ledger.byId.get(s.chaosId, [])
            for a in attempts:
                self.report.behaviours[a.label] += 1
            problem = judge(
                s, attempts, self.config, self.churned(s), self.wasEmpty(s), len(self.engines)
            )
            self.report.answers[f"{s.kind}:{s.answer}"] += 1
            if problem:
                self.report.violations.append(
                    f"{s.chaosId} {s.method} {s.path} stream={s.stream} -> {s.status} "
                    f"{s.answer} node={s.node} attempts={s.attempts} "
                    f"seen={[(a.engine, a.label) for a in attempts]}: {problem}"
                )

    def checkWorkloads(self) -> None:
        """Exactly one terminal event per workload, matching the answers per model and state."""
        assert self.proxy is not None
        events: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        seqs: list[int] = []
        for method, info in self.proxy.workloadEvents():
            events.setdefault(info["id"], []).append((method, info))
            seqs.append(info["seq"])
        r = self.report
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
            r.violations.append("workload seq not strictly increasing")
        observed: Counter[tuple[str, str, str | None]] = Counter()
        for wid, evs in events.items():
            terminals = [e for e in evs if e[0] in ("workload:completed", "workload:errored")]
            if len(terminals) != 1:
                r.violations.append(f"workload {wid}: {len(terminals)} terminal events")
                continue
            if evs[-1] is not terminals[0]:
                r.violations.append(f"workload {wid}: events after the terminal one")
            method, info = terminals[0]
            expected = "workload:completed" if info["state"] == "completed" else "workload:errored"
            if method != expected:
                r.violations.append(f"workload {wid}: {method} with state {info['state']}")
            node = info.get("scheduledOn") if "startedAt" in info else None
            observed[(info["model"], info["state"], node)] += 1
        wanted: Counter[tuple[str, str, str | None]] = Counter()
        for s in self.sent:
            if s.kind == "inference" and s.state is not None:
                assert s.model is not None
                node = s.node if s.answer in ("full", "cut", "passthrough") else None
                wanted[(s.model + ":latest", s.state, node)] += 1
        self.report.figures["workloads"] = len(events)
        self.report.figures["workload terminal states"] = dict(
            Counter(state for (_, state, _) in observed.elements())
        )
        if observed != wanted:
            diff = (observed - wanted) + (wanted - observed)
            r.violations.append(
                f"workload terminals differ from answers: "
                f"extra={dict(observed - wanted)} missing={dict(wanted - observed)}"
                if diff
                else "workload mismatch"
            )

    def checkSecrets(self) -> None:
        """The canary never reaches the log, a JSON-RPC message, or a generated error body."""
        assert self.proxy is not None
        canary = CANARY
        leaks = [r for r in self.proxy.logs if canary in json.dumps(r)]
        if leaks:
            self.report.violations.append(f"canary in {len(leaks)} log lines: {leaks[0]}"[:300])
        rpc: list[object] = [m for m in self.proxy.notifications if canary in json.dumps(m)]
        rpc += [p for p in self.proxy.protocolErrors if canary in p]
        if rpc:
            self.report.violations.append(f"canary in {len(rpc)} JSON-RPC messages")
        generated = [
            s for s in self.sent if s.answer.startswith("gen:") and canary.encode() in s.body
        ]
        if generated:
            self.report.violations.append(f"canary in {len(generated)} generated error bodies")
        self.report.figures["log lines"] = len(self.proxy.logs)
        self.report.figures["notifications"] = len(self.proxy.notifications)
