"""Checkpoints of the paper's model families with random weights: what a user's local checkpoint looks like to the
harness (`config.json` of the family's architecture, a tokenizer with the family's special tokens and chat template,
`save_pretrained` files), for tests on CPU and the GPU check, where no real checkpoint can be downloaded.

`shape="small"` shrinks the widths and depth (a CPU cell trains it in seconds); a released model's name
(`"Qwen3-0.6B"`, `"Qwen3-4B"`) keeps its widths and depth (the GPU check). The vocabulary is a byte-level BPE trained on sample texts plus the family's special tokens,
so ids differ from the released tokenizer's; the template is the one given (a file's text), by default the shipped
prefix-stable one.
"""

from __future__ import annotations

from pathlib import Path

QWEN3_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN3_ADDED = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Qwen3's tokenizer marks the first three special; the reasoning and tool markers are added tokens that are not
special (they decode as text)."""

FAMILIES: dict[str, dict] = {
    "qwen3": dict(
        model_type="qwen3",
        real={
            "Qwen3-0.6B": dict(
                hidden_size=1024,
                intermediate_size=3072,
                num_hidden_layers=28,
                num_attention_heads=16,
                num_key_value_heads=8,
                head_dim=128,
            ),
            "Qwen3-4B": dict(
                hidden_size=2560,
                intermediate_size=9728,
                num_hidden_layers=36,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
            ),
        },
        common=dict(
            max_position_embeddings=40960,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            attention_bias=False,
            hidden_act="silu",
        ),
    ),
    "qwen3.5": dict(
        model_type="qwen3_5_text",
        real={},  # the released 4B's widths are not known here: small only
        common=dict(max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True),
        hybrid=True,  # three Gated DeltaNet layers, then one full attention layer
    ),
}
"""Per family: the transformers model type, the released models' widths and depths (their config.json), and the
keys every size shares."""

SMALL = dict(
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
)


def family_tokenizer(texts: list[str], chat_template: str, vocab_size: int = 512):
    """A `PreTrainedTokenizerFast` laid out as Qwen3's: ChatML markers special, `<|im_end|>` the EOS (the instruct
    checkpoints' choice), `<|endoftext|>` the pad, reasoning and tool markers added as plain tokens."""
    from transformers import AddedToken, PreTrainedTokenizerFast

    from trainer.policy.chat_format import build_tokenizer

    tok = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(texts, vocab_size=vocab_size, special_tokens=QWEN3_SPECIALS),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_ADDED])
    tok.chat_template = chat_template
    return tok


def write_standin_checkpoint(
    family: str,
    directory: str | Path,
    texts: list[str],
    *,
    chat_template: str | None = None,
    shape: str = "small",
    seed: int = 0,
    dtype: str = "float32",
) -> Path:
    """Write a checkpoint of `family` (FAMILIES) with random weights into `directory`, as `from_pretrained` reads
    one; `chat_template` None ships the prefix-stable `qwen3-stable`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.policy.load import DTYPES
    from trainer.policy.templates import read_chat_template

    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {sorted(FAMILIES)}")
    spec = FAMILIES[family]
    linear = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    if shape == "small":
        dims = {k: v for k, v in SMALL.items() if spec.get("hybrid") or k not in linear}
    elif shape in spec["real"]:
        dims = spec["real"][shape]
    else:
        raise ValueError(f"{family} has no shape {shape!r}; known: small, {', '.join(spec['real']) or '(none)'}")
    tok = family_tokenizer(texts, chat_template if chat_template is not None else read_chat_template("qwen3-stable"))
    config = AutoConfig.for_model(
        spec["model_type"],
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **spec["common"],
        **dims,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    directory = Path(directory)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
