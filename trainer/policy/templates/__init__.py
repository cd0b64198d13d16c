"""Chat templates the harness ships (`model.chat_template: <name>`): the rollout appends every turn's tokens to
the conversation it has, so a policy's template must render a conversation as a prefix of its continuation.

`qwen3-stable`: the ChatML layout of Qwen3 and Qwen3.5 with every assistant turn's reasoning block kept (an empty
one where the turn had none). Qwen's own templates drop the reasoning of turns before the last user message, so
the text of turn k changes once turn k+1 exists; the engine would then train on token sequences the template
never renders, and the harness refuses such templates. What the model sees at its newest turn (the generation
prompt, with `enable_thinking: false` the empty block in it) is Qwen's own rendering, token for token (tested).
SkyRL and other RL frameworks ship the same change for multi-turn training.
"""

from __future__ import annotations

from pathlib import Path

from trainer.knobs import ConfigError

TEMPLATES_DIR = Path(__file__).parent


def shipped_templates() -> list[str]:
    """Names of the shipped chat templates (the .jinja files of this folder)."""
    return sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))


def find_chat_template(spec: str, root: str | Path = ".") -> Path:
    """The file of the shipped template named `spec`, or the Jinja file at path `spec` (relative to `root`);
    ConfigError naming the spec when it is neither (the caller puts its key before the message)."""
    for path in (TEMPLATES_DIR / f"{spec}.jinja", Path(root) / spec):
        if path.is_file():
            return path
    raise ConfigError(f"{spec!r} is neither a shipped template ({', '.join(shipped_templates())}) nor a file")


def read_chat_template(spec: str) -> str:
    """The text of a shipped template named `spec`, or of the Jinja file at path `spec`."""
    try:
        return find_chat_template(spec).read_text()
    except ConfigError as err:
        raise ConfigError(f"model.chat_template: {err}") from None
