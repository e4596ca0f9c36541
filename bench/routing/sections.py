"""The ``bench/RESULTS.md`` sections of the agent workload and of the chat workload on real
llama-servers (the simulated chat one is ``report.markdown``)."""

from __future__ import annotations

from typing import Any

from bench.routing.report import routerTable

AGENTS_HEADING = "## Placement: agents over Messages (issue 30)"
REAL_HEADING = "## Placement on real llama-servers: short system prompts (issue 31)"


def _targets(results: dict[str, Any]) -> list[str]:
    """nvpair against the oracle: cache share within 3 points, TTFT p90 within 1.2×."""
    routers = results["routers"]
    oracle, nvpair = routers.get("oracle"), routers.get("nvpair-prefix")
    if not oracle or not nvpair or "skipped" in oracle or "skipped" in nvpair:
        return []
    gap = (oracle["hitRatio"] - nvpair["hitRatio"]) * 100  # points below the oracle
    o90, n90 = oracle["ttft"]["p90"], nvpair["ttft"]["p90"]
    ratio = n90 / o90 if o90 and n90 is not None else None
    return [
        "",
        f"Targets (issue 30): prompt tokens from cache within 3 points of the oracle: "
        f"{nvpair['hitRatio']:.1%} against {oracle['hitRatio']:.1%}, "
        f"**{'PASS' if gap <= 3 else 'FAIL'}**; TTFT p90 within "
        f"1.2× the oracle's: "
        + ("–" if ratio is None else f"{ratio:.2f}×, **{'PASS' if ratio <= 1.2 else 'FAIL'}**")
        + ".",
    ]


def agentsMarkdown(results: dict[str, Any]) -> str:
    """The agent workload's dated section."""
    w, e = results["workload"], results["engines"]
    lines = [
        f"{AGENTS_HEADING}, run of {results['date']}",
        "",
        f"`{results['command']}` ({results['machine']}). {w['apps']} apps × {w['agents']} "
        f"agents × {w['turns']} model calls: {results['turns']} streamed `POST /v1/messages` "
        f"per router. Each app: a system prompt of {w['systemWords']} words and {w['tools']} "
        f"tool definitions (descriptions of {w['toolWords']} words), {results['prefixTokens']} "
        "tokens before the first message, shared by its agents. Each agent: a task of "
        f"{w['taskWords']} words, then after every answer ({w['answerTokens']} tokens) an "
        "assistant turn with the answer's text and a `tool_use` block and a user turn with the "
        f"`tool_result` (about {w['resultWords']} words), the tool running {w['think']} s "
        f"(mean, exponential) before the next call; sessions start within {w['ramp']} s, "
        f"seed {w['seed']}. {e['count']} simulated llama.cpp engines "
        "(`nvpair.proxy.testing.simengine`, fresh for each router; Messages rendered "
        f"`system`, `tools`, then `messages`), each {e['slots']} slots, a prefix cache of "
        f"{e['cacheTokens']} tokens in blocks of {e['blockSize']} (together "
        f"{results['cacheShare']:.0%} of the working set of {results['workingSet']} tokens), "
        f"prefill {e['prefillMs']} ms per uncached token, decode {e['decodeMs']} ms per token. "
        "TTFT: request sent → first `text_delta`. Cache hits: prompt tokens the engines served "
        "from cache over all prompt tokens (their `/sim/stats`). Apps per engine: the engine "
        "that served most of each app's calls. The oracle pins each app's agents to one engine, "
        "apps spread evenly. A router that does not answer `POST /v1/messages` is listed as "
        "skipped, with what it answered.",
        "",
        *routerTable(results, "apps", {"oracle": "each app pinned to one engine (an oracle)"}),
        *_targets(results),
    ]
    return "\n".join(lines) + "\n"


def realMarkdown(results: dict[str, Any]) -> str:
    """The chat workload's dated section on real llama-servers."""
    w, e = results["workload"], results["engines"]
    lines = [
        f"{REAL_HEADING}, run of {results['date']}",
        "",
        f"`{results['command']}` ({results['machine']}). {w['tenants']} tenants × "
        f"{w['users']} users × {w['turns']} turns (system prompts of {w['systemWords']} words, "
        f"about {results['systemChars']} characters; questions {w['questionWords']} words; "
        f"answers {w['answerTokens']} tokens, `ignore_eos`, temperature 0; think time "
        f"{w['think']} s mean; start spread over {w['ramp']} s; seed {w['seed']}): "
        f"{results['turns']} streamed chat requests per router. {e['count']} real "
        f"llama-servers ({e['model']}, `-np {e['slots']} {e['llamaArgs']}`), fresh for "
        "each router. TTFT: request sent → first content chunk. Cache hits: the answers' "
        "`prompt_tokens_details.cached_tokens` over `prompt_tokens`. Requests per engine: "
        "by the proxy's `X-Nvpair-Node` or the engine the client chose; a Rust router does not "
        "say which engine served, so its requests are counted in one last column.",
        "",
        *routerTable(results, "tenants"),
        *_againstSglang(results),
    ]
    return "\n".join(lines) + "\n"


def _againstSglang(results: dict[str, Any]) -> list[str]:
    """Issue 31's third target: cache hits and TTFT p90 at least SGLang's gateway's."""
    routers = results["routers"]
    sglang, nvpair = routers.get("sglang"), routers.get("nvpair-prefix")
    if not sglang or not nvpair or "skipped" in sglang or "skipped" in nvpair:
        return []
    hits = nvpair["hitRatio"] >= sglang["hitRatio"]
    n90, s90 = nvpair["ttft"]["p90"], sglang["ttft"]["p90"]
    fast = n90 is not None and s90 is not None and n90 <= s90
    return [
        "",
        f"Target (issue 31): cache hits at least SGLang's gateway's: {nvpair['hitRatio']:.1%} "
        f"against {sglang['hitRatio']:.1%}, **{'PASS' if hits else 'FAIL'}**; TTFT p90 at "
        f"most its: {n90 or 0:.2f} s against {s90 or 0:.2f} s, **{'PASS' if fast else 'FAIL'}**.",
    ]
