"""The simulated engine's state and probe documents, in the shapes the real servers use.

* llama.cpp ``GET /slots`` (a list of slots: ``id``, ``n_ctx``, ``speculative``,
  ``is_processing``, and a busy slot's task) and ``GET /metrics`` (Prometheus text,
  ``llamacpp:*``); when the server was started without them, 501 ``not_supported_error``,
  as llama-server answers;
* Ollama ``GET /api/version`` (its ``/api/ps`` is ``residency.routes``');
* LM Studio ``GET /api/v0/models`` (every model with ``state`` ``loaded`` or ``not-loaded``);
* the probes of the Rust routers: ``GET /health``, SGLang's ``GET /get_model_info`` and
  ``GET /get_server_info``, and ``POST /tokenize`` (vLLM's format; llama.cpp's when the body
  has ``content``).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from nvpair.proxy.testing.simengine.replies import dumps


def slotsDocument(busy: Sequence[bool], nCtx: int, tasks: Sequence[int]) -> bytes:
    """llama-server's ``/slots``: one entry per slot (``tasks[i]`` is -1 when idle); as the
    real server, an idle slot is ``id``, ``n_ctx``, ``speculative`` and ``is_processing``
    only, a busy one adds its task, parameters and next-token state."""
    slots: list[dict[str, object]] = []
    for i, processing in enumerate(busy):
        slot: dict[str, object] = {
            "id": i,
            "n_ctx": nCtx,
            "speculative": False,
            "is_processing": processing,
        }
        if processing:
            slot["id_task"] = tasks[i]
            slot["params"] = {"n_predict": -1, "stream": True}
            slot["next_token"] = {
                "has_next_token": True,
                "has_new_line": False,
                "n_remain": -1,
                "n_decoded": 0,
            }
        slots.append(slot)
    return dumps(slots)


def metricsText(
    promptTokens: int,
    promptSeconds: float,
    predictedTokens: int,
    predictedSeconds: float,
    decodes: int,
    processing: int,
    deferred: int,
) -> bytes:
    """llama-server's ``/metrics`` (Prometheus text format 0.0.4)."""
    rows = [
        ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", promptTokens),
        ("prompt_seconds_total", "counter", "Prompt process time", promptSeconds),
        (
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            predictedTokens,
        ),
        ("tokens_predicted_seconds_total", "counter", "Predict process time", predictedSeconds),
        ("n_decode_total", "counter", "Total number of llama_decode() calls", decodes),
        (
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            promptTokens / promptSeconds if promptSeconds else 0.0,
        ),
        (
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            predictedTokens / predictedSeconds if predictedSeconds else 0.0,
        ),
        ("requests_processing", "gauge", "Number of requests processing.", processing),
        ("requests_deferred", "gauge", "Number of requests deferred.", deferred),
    ]
    out = []
    for name, kind, help_, value in rows:
        out.append(f"# HELP llamacpp:{name} {help_}\n# TYPE llamacpp:{name} {kind}\n")
        out.append(f"llamacpp:{name} {value}\n")
    return "".join(out).encode()


def rfc3339(seconds: float) -> str:
    """A UTC time as RFC 3339 (what Ollama writes in ``expires_at``)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def lmstudioModels(models: Sequence[tuple[str, bool]], nCtx: int) -> bytes:
    """LM Studio's ``/api/v0/models``: every model and whether it is loaded."""
    data = []
    for name, loaded in models:
        entry: dict[str, object] = {
            "id": name,
            "object": "model",
            "type": "llm",
            "publisher": "sim",
            "arch": "sim",
            "compatibility_type": "gguf",
            "quantization": "Q4_K_M",
            "state": "loaded" if loaded else "not-loaded",
            "max_context_length": nCtx,
        }
        if loaded:
            entry["loaded_context_length"] = nCtx
        data.append(entry)
    return dumps({"object": "list", "data": data})


def modelInfo(model: str) -> bytes:
    """SGLang's ``/get_model_info``."""
    return dumps(
        {
            "model_path": model,
            "tokenizer_path": model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }
    )


def serverInfo(model: str, slots: int, nCtx: int, cacheTokens: int) -> bytes:
    """SGLang's ``/get_server_info`` (the fields the routers read)."""
    return dumps(
        {
            "model_path": model,
            "tokenizer_path": model,
            "served_model_name": model,
            "tp_size": 1,
            "dp_size": 1,
            "max_running_requests": slots,
            "context_length": nCtx,
            "max_total_num_tokens": cacheTokens,
            "disaggregation_mode": "null",
            "version": "sim",
        }
    )


def tokenizeDocument(ids: Sequence[int], llama: bool, nCtx: int) -> bytes:
    """The answer of ``POST /tokenize``: llama.cpp's ``{"tokens"}`` or vLLM's with ``count``."""
    if llama:
        return dumps({"tokens": list(ids)})
    return dumps(
        {"count": len(ids), "max_model_len": nCtx, "tokens": list(ids), "token_strs": None}
    )
