"""The seeded agent workload (issue 30 item 8): apps whose agents share a long system prompt
and tool definitions, each agent a session of model calls that grows by tool results.

Every app has its own system prompt of about ``systemWords`` words and ``tools`` tool
definitions (a name, a description of about ``toolWords`` words, an input schema): a few
thousand tokens that all its agents send first, as Claude Code or Codex do. Each agent
holds one session of ``turns`` model calls over ``POST /v1/messages``: the first sends a
task; after each answer the agent appends the assistant turn (the answer's text and a
``tool_use`` block) and a user turn holding the ``tool_result`` (about ``resultWords``
words, 0.5–1.5× that), waits while the tool runs (exponential, mean ``think`` seconds) and
calls the model again with the whole history. Sessions start within ``ramp`` seconds. The
same seed gives the same prompts, tools, results and schedule.
"""

from __future__ import annotations

import random
from typing import Any

import attrs

from bench.routing.workload import randomText
from nvpair.proxy.testing.simengine.agents.render import messagesWords

TOOL_NAMES = (
    "read_file",
    "edit_file",
    "run_command",
    "grep",
    "list_directory",
    "web_fetch",
    "write_file",
    "search_symbols",
    "run_tests",
    "git_diff",
    "ask_user",
    "todo_write",
)


@attrs.frozen
class AgentSizes:
    """The agent workload's dimensions."""

    apps: int = 6
    agents: int = 4
    turns: int = 8
    systemWords: int = 1500
    tools: int = 8
    toolWords: int = 150
    taskWords: int = 40
    resultWords: int = 200
    answerTokens: int = 32
    think: float = 1.0
    ramp: float = 8.0
    seed: int = 1


@attrs.frozen
class Session:
    """One agent's session: its app (``tenant``), when it starts, its prompt, tools, task,
    the tool calls it makes and their results, the tools' run times."""

    tenant: int
    user: int
    start: float
    system: str
    tools: tuple[dict[str, Any], ...] = attrs.field(hash=False)
    task: str
    calls: tuple[tuple[str, str], ...]
    results: tuple[str, ...]
    pauses: tuple[float, ...]

    @property
    def turns(self) -> int:
        """Model calls in the session: one per tool result, and the last."""
        return len(self.results) + 1


def _tools(rng: random.Random, app: int, sizes: AgentSizes) -> tuple[dict[str, Any], ...]:
    out = []
    for i in range(sizes.tools):
        name = TOOL_NAMES[i % len(TOOL_NAMES)] + ("" if i < len(TOOL_NAMES) else f"_{i}")
        out.append(
            {
                "name": name,
                "description": randomText(rng, sizes.toolWords, f"a{app}"),
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": randomText(rng, 12, f"a{app}")},
                        "pattern": {"type": "string", "description": randomText(rng, 8, f"a{app}")},
                    },
                    "required": ["path"],
                },
            }
        )
    return tuple(out)


def sessions(sizes: AgentSizes) -> list[Session]:
    """Every agent session of the workload, by start time."""
    rng = random.Random(sizes.seed)
    prompts = [randomText(rng, sizes.systemWords, f"a{a}") for a in range(sizes.apps)]
    tools = [_tools(rng, a, sizes) for a in range(sizes.apps)]
    out = []
    for app in range(sizes.apps):
        for agent in range(sizes.agents):
            tag = f"s{app}.{agent}"
            calls = tuple(
                (rng.choice(tools[app])["name"], randomText(rng, 3, f"{tag}.{k}"))
                for k in range(sizes.turns - 1)
            )
            results = tuple(
                randomText(
                    rng, max(1, int(sizes.resultWords * rng.uniform(0.5, 1.5))), f"{tag}.{k}"
                )
                for k in range(sizes.turns - 1)
            )
            pauses = tuple(
                rng.expovariate(1 / sizes.think) if sizes.think > 0 else 0.0 for _ in results
            )
            out.append(
                Session(
                    tenant=app,
                    user=agent,
                    start=rng.uniform(0, sizes.ramp),
                    system=prompts[app],
                    tools=tools[app],
                    task=randomText(rng, sizes.taskWords, tag),
                    calls=calls,
                    results=results,
                    pauses=pauses,
                )
            )
    out.sort(key=lambda s: s.start)
    return out


def toolTurns(session: Session, turn: int, answer: str) -> list[dict[str, Any]]:
    """What follows answer ``turn``: the assistant turn (its text and the tool call) and the
    user turn holding the tool's result."""
    name, argument = session.calls[turn]
    ident = f"toolu_{session.tenant}_{session.user}_{turn}"
    call = {"type": "tool_use", "id": ident, "name": name, "input": {"path": argument}}
    result = {"type": "tool_result", "tool_use_id": ident, "content": session.results[turn]}
    return [
        {"role": "assistant", "content": [{"type": "text", "text": answer}, call]},
        {"role": "user", "content": [result]},
    ]


def requestBody(session: Session, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts of a Messages request that the prompt is rendered from."""
    return {"system": session.system, "tools": list(session.tools), "messages": messages}


def prefixTokens(session: Session) -> int:
    """Tokens of the session's app prefix (system prompt and tools) as the engine renders it."""
    return len(messagesWords(requestBody(session, [])) or []) - 1  # less the assistant marker


def workingSet(sizes: AgentSizes, all: list[Session]) -> int:
    """Tokens a cache would need to hold every app's prefix once and every session's own
    history to its last answer, as the simulated engine renders them."""
    answer = " ".join(f"tok{i}" for i in range(sizes.answerTokens))
    prefixes: dict[int, int] = {}
    total = 0
    for s in all:
        messages: list[dict[str, Any]] = [{"role": "user", "content": s.task}]
        for turn in range(s.turns - 1):
            messages += toolTurns(s, turn, answer)
        words = messagesWords(requestBody(s, messages)) or []
        prefixes[s.tenant] = prefixTokens(s)
        total += len(words) + sizes.answerTokens - prefixes[s.tenant]
    return total + sum(prefixes.values())
