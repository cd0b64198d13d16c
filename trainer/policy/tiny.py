"""Tiny causal LMs built from Hugging Face architecture configs: the embedded study's stand-ins.

The paper trains MiniCPM5-2B and Qwen3.5-4B. At embedded scale each family is a ~1M-parameter model of a
different architecture and size, so "two model families" still means two different networks: a Llama decoder
for MiniCPM (MiniCPM's dense models are Llama decoders with scaled embeddings, residual branches and head input,
trainer/policy/minicpm/; the embedded preset, whose results the studies report, leaves the scalings out) and a
Qwen3 decoder (QK-norm, its own attention layout) for Qwen3.5. The companion study's Qwen2.5-0.5B-Instruct gets a Qwen2 decoder (biased QKV
projections, no QK-norm). Built from a config, no weights downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

TINY_PRESETS: dict[str, dict] = {
    "minicpm-tiny": dict(
        model_type="llama",
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "qwen2.5-tiny": dict(
        model_type="qwen2",
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "qwen-tiny": dict(
        model_type="qwen3",
        hidden_size=160,
        intermediate_size=416,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=40,
        tie_word_embeddings=True,
    ),
    "qwen3.5-tiny": dict(
        model_type="qwen3_5_text",
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        tie_word_embeddings=True,
    ),
}
"""`qwen3.5-tiny` is Qwen3.5's hybrid text decoder (three Gated DeltaNet linear-attention layers, then one full
attention layer, with their 3-D conv1d kernels): what the router and the engine must handle for the paper's
Qwen3.5-4B, at embedded size. The embedded studies keep `qwen-tiny`, whose results they report."""


@dataclass
class TinyModelSpec:
    preset: str
    vocab_size: int
    max_position_embeddings: int = 2048


def build_tiny_model(spec: TinyModelSpec, seed: int = 0):
    """A freshly initialised causal LM for `spec` (deterministic in `seed`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.preset not in TINY_PRESETS:
        raise ValueError(f"unknown tiny model preset {spec.preset!r}; known: {sorted(TINY_PRESETS)}")
    kwargs = dict(TINY_PRESETS[spec.preset])
    model_type = kwargs.pop("model_type")
    config = AutoConfig.for_model(
        model_type, vocab_size=spec.vocab_size, max_position_embeddings=spec.max_position_embeddings, **kwargs
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)
