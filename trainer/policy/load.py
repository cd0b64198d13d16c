"""Policies and their tokenizers: a tiny model from a preset, a warm-started tiny model, or a real checkpoint.

A policy directory written by `save_policy` holds the Hugging Face model (`save_pretrained`), its tokenizer (the
tiny models' `tokenizers` file `tokenizer.json`, or a real checkpoint's own tokenizer files) and
`harness_policy.json`: which chat format it speaks, and what made it (the warm start's report, or the update and
seed of a trained cell, which `python -m trainer eval` reads). A real checkpoint (MiniCPM5-2B, Qwen3.5-4B,
Qwen2.5-0.5B-Instruct) is any directory `from_pretrained` can read locally; its own tokenizer is used, with its own
chat template or the one the study names (a shipped one from templates/, or a file), which a saved policy then
carries. Nothing is ever downloaded (`local_files_only=True`); a checkpoint's own code runs only where the study
sets `model.trust_remote_code`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer.knobs import ConfigError
from trainer.policy.templates import read_chat_template
from trainer.policy.tiny import TinyModelSpec, build_tiny_model

POLICY_META = "harness_policy.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def new_tiny_policy(preset: str, texts: list[str], *, vocab_size: int = 384, seed: int = 0, max_positions: int = 2048):
    """A freshly initialised tiny model with a byte-level BPE tokenizer trained on `texts`."""
    from trainer.policy.chat_format import TinyFormat, build_tokenizer

    tokenizer = build_tokenizer(texts, vocab_size=vocab_size)
    model = build_tiny_model(
        TinyModelSpec(preset, vocab_size=tokenizer.get_vocab_size(), max_position_embeddings=max_positions), seed=seed
    )
    return model, TinyFormat(tokenizer)


def save_policy(model, fmt, directory: str | Path, extra: dict | None = None) -> None:
    """Write model + tokenizer + metadata (`extra` merged in) into `directory`, so that `load_policy` reads back the
    same weights and chat format."""
    from trainer.policy.chat_format import HFChatFormat, TinyFormat, tiny_tokenizer_config

    if not isinstance(fmt, (TinyFormat, HFChatFormat)):
        raise TypeError(f"save_policy: unknown chat format {type(fmt).__name__}")
    if isinstance(fmt, HFChatFormat) and (
        fmt.system_prompt is not None
        or fmt.stop_ids != HFChatFormat(fmt.tokenizer, template_options=fmt.template_options).stop_ids
    ):
        raise ValueError(
            "save_policy: a chat format with a system prompt or extra stop tokens would not be read "
            "back by load_policy (it builds the tokenizer's default format)"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(fmt, TinyFormat):  # its own special tokens, so generate() and vLLM stop where the harness does
        for config in (model.config, getattr(model, "generation_config", None)):
            if config is not None:
                config.bos_token_id, config.eos_token_id, config.pad_token_id = fmt.bos_id, fmt.eot_id, fmt.pad_id
    model.save_pretrained(directory)
    if isinstance(fmt, TinyFormat):
        (directory / TOKENIZER_FILE).write_text(fmt.tokenizer.to_str())
        (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(tiny_tokenizer_config(fmt), indent=2))
    else:
        fmt.tokenizer.save_pretrained(directory)
    meta = {"format": "tiny"} if isinstance(fmt, TinyFormat) else {"format": "hf"}
    if isinstance(fmt, HFChatFormat) and fmt.template_options:
        meta["template_options"] = fmt.template_options
    (directory / POLICY_META).write_text(json.dumps({**meta, **(extra or {})}, indent=2))


def policy_meta(path: str | Path) -> dict:
    """The `harness_policy.json` of a policy directory; {} for a checkpoint that has none."""
    meta_file = Path(path) / POLICY_META
    return json.loads(meta_file.read_text()) if meta_file.exists() else {}


def policy_options(model_cfg) -> dict:
    """`load_policy`'s keyword arguments from a cell's `ModelConfig`."""
    return dict(
        trust_remote_code=model_cfg.trust_remote_code,
        chat_template=model_cfg.chat_template,
        template_options=model_cfg.template_options,
    )


def check_text_only(path: Path) -> None:
    """ConfigError for a vision-language checkpoint (a `vision_config` in config.json, as Qwen3.5's releases with
    an image encoder have): transformers would load its language model alone, but vLLM serves the whole model,
    under other parameter names (`model.language_model.*`) and with the vision tower's parameters, which the
    trainer's weight push never sends; the first push would be refused hours into a cell. Refused up front."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if "vision_config" in config:
        raise ConfigError(
            f"{config_file}: a vision-language checkpoint ({', '.join(config.get('architectures') or ['?'])}); the "
            "harness trains and serves text-only causal LMs: give model.path a checkpoint of its language model "
            "alone (its text config and `model.*` weights)"
        )


def load_policy(
    path: str | Path,
    dtype: str = "float32",
    *,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
    template_options: dict | None = None,
):
    """(model, chat format) from a policy directory or a Hugging Face checkpoint directory; `chat_template` and
    `template_options` as `ModelConfig`'s (options saved with a policy apply unless given again)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.policy.chat_format import HFChatFormat, TinyFormat

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"policy directory {str(path)!r} does not exist")
    check_text_only(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code
        )
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise
        raise ConfigError(
            f"{path}: the checkpoint's architecture is defined by its own code (auto_map in config.json), which "
            "runs only with model.trust_remote_code: true in the study"
        ) from None
    meta = policy_meta(path)
    if meta.get("format") == "tiny":
        from tokenizers import Tokenizer

        # The pad id save_policy writes is for generate() and vLLM; from_pretrained also makes it the embedding's
        # padding_idx, which zeroes that row's gradient and so changes training. A tiny policy trains as it did
        # before its config named a pad id (the published version-6 studies but four).
        model.get_input_embeddings().padding_idx = None
        return model, TinyFormat(Tokenizer.from_str((path / TOKENIZER_FILE).read_text()))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    options = {**meta.get("template_options", {}), **(template_options or {})}
    try:
        return model, HFChatFormat(tokenizer, template_options=options)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
