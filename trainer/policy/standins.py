"""Checkpoints of the paper's model families with random weights: what a user's local checkpoint looks like to the
harness (`config.json` of the family's architecture, a tokenizer with the family's special tokens and chat template,
`save_pretrained` files; for MiniCPM, its own modelling code behind `auto_map`, trainer/policy/minicpm/), for tests
on CPU and the GPU check, where no real checkpoint can be downloaded.

`shape="small"` shrinks the widths and depth (a CPU cell trains it in seconds); a released model's name
(`"Qwen3-0.6B"`, `"Qwen3-4B"`) keeps its widths and depth (the GPU check). The vocabulary is a byte-level BPE trained on sample texts plus the family's special tokens,
so ids differ from the released tokenizer's; the template is the one given (a file's text), by default the family's
(Qwen: the shipped prefix-stable one; MiniCPM: the ChatML layout MiniCPM3 and MiniCPM4 ship, assumed for MiniCPM5).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from trainer.policy.tiny import TINY_PRESETS

QWEN3_ADDED = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Qwen3's reasoning and tool markers: added tokens that are not special (they decode as text)."""

MINICPM_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The ChatML layout of MiniCPM3's and MiniCPM4's chat templates, less their tool-call rendering."""

MINICPM_CODE = Path(__file__).with_name("minicpm")

QWEN3_TOKENIZER = dict(
    specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>", pad="<|endoftext|>", added=QWEN3_ADDED
)
"""Qwen3's special tokens, EOS (the instruct checkpoints' choice), pad, and the markers added as plain tokens."""

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
        tokenizer=QWEN3_TOKENIZER,
    ),
    "minicpm": dict(
        model_type="minicpm",  # transformers has no such type: the checkpoint's own code defines it (auto_map)
        real={},  # MiniCPM5-2B's widths are not known here: small only
        common=dict(
            scale_emb=12.0,  # MiniCPM-2B's scalings
            dim_model_base=256,
            scale_depth=1.4,
            max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            hidden_act="silu",
        ),
        tokenizer=dict(
            specials=("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>", pad="<unk>", added=()
        ),
    ),
    "qwen3.5": dict(
        model_type="qwen3_5_text",
        real={},  # the released 4B's widths are not known here: small only
        common=dict(max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True),
        tokenizer=QWEN3_TOKENIZER,
        hybrid=True,  # three Gated DeltaNet layers, then one full attention layer
    ),
}
"""Per family: the transformers model type, the released models' widths and depths (their config.json), and the
keys every size shares."""

SMALL = {k: v for k, v in TINY_PRESETS["qwen3.5-tiny"].items() if k not in ("model_type", "tie_word_embeddings")}
"""The small shape: the embedded qwen3.5-tiny preset's widths (its linear-attention keys used by the hybrid only)."""


def family_tokenizer(texts: list[str], chat_template: str, family: str = "qwen3", vocab_size: int = 512):
    """A `PreTrainedTokenizerFast` laid out as `family`'s (FAMILIES): its special tokens, EOS, pad and the markers
    it adds as plain tokens, over a byte-level BPE trained on `texts`."""
    from transformers import AddedToken, PreTrainedTokenizerFast

    from trainer.policy.chat_format import build_tokenizer

    layout = FAMILIES[family]["tokenizer"]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(texts, vocab_size=vocab_size, special_tokens=layout["specials"]),
        eos_token=layout["eos"],
        pad_token=layout["pad"],
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in layout["added"]])
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
    one; `chat_template` None ships the family's own (see the module docstring)."""
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
    if chat_template is None:
        chat_template = MINICPM_CHATML if family == "minicpm" else read_chat_template("qwen3-stable")
    tok = family_tokenizer(texts, chat_template, family)
    keys = dict(vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **spec["common"])
    if family == "minicpm":
        from trainer.policy.minicpm.configuration_minicpm import MiniCPMConfig
        from trainer.policy.minicpm.modeling_minicpm import MiniCPMForCausalLM

        config = MiniCPMConfig(**keys, **dims)
        config.auto_map = {
            "AutoConfig": "configuration_minicpm.MiniCPMConfig",
            "AutoModelForCausalLM": "modeling_minicpm.MiniCPMForCausalLM",
        }
        build = lambda: MiniCPMForCausalLM(config).to(DTYPES[dtype])  # noqa: E731
    else:
        config = AutoConfig.for_model(spec["model_type"], **keys, **dims)
        build = lambda: AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])  # noqa: E731
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    directory = Path(directory)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    if family == "minicpm":  # the release's own code, which auto_map names
        for name in ("configuration_minicpm.py", "modeling_minicpm.py"):
            shutil.copyfile(MINICPM_CODE / name, directory / name)
    return directory
