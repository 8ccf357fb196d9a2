"""Typed values of the engine layer: model config, sampling parameters, the call ledger."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """A kvdeck model folder's config.json (docs/ENGINE.md), validated."""

    model: str
    architecture: str  # "llama" | "qwen2" | "qwen3"
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_id: int | None
    stop_token_ids: tuple[int, ...]
    chat_format: str
    weight_format: str
    rope_scaling: dict | None = None
    chat_template: str = field(default="", repr=False)


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when temperature == 0; otherwise temperature, then top-k, then top-p."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


@dataclass(frozen=True)
class CallStats:
    """The per-call ledger (DESIGN.md § Per-turn ledger).

    computed = prompt - cached; new = prompt tokens beyond the session's previous call's
    prompt + output; waste = computed - new (recomputed although seen: eviction, prefix
    break, partial page), floored at 0; reuse = cached / prompt.
    """

    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    new_tokens: int
    waste_tokens: int
    reuse: float
    ttft_s: float
    prefill_s: float
    decode_s: float
    decode_tokens: int
    decode_tok_s: float
    finish_reason: str  # "stop" | "length" | "cancelled" | "pool_full"
    weight_format: str
    kv_format: str
    backend: str
    kv_used_pages: int
    kv_pinned_pages: int
    kv_free_pages: int
    evicted_pages: int
    threads: int = 0
    events_dropped: int = 0  # cache events the native ring lost during the call (ring full)
    kind: str = "generate"  # "generate" | "prewarm" (the static prefix computed ahead of call 1)
    # | "trim" (the kept history after a trim made ahead of the next call, computed in idle time)

    def as_dict(self) -> dict:
        return asdict(self)
