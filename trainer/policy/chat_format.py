"""How a multi-turn episode's text becomes tokens, per model kind: the tiny models' layout and real chat templates.

The rollout engine keeps one KV cache per episode across turns, so it never re-tokenizes the conversation: it
needs the tokens of the *first* observation (the prompt) and then, after every action, only the tokens that the
next observation *adds*. A format object answers exactly those questions:

    prompt_ids(first_observation) -> list[int]          everything before the first action token
    observation_ids(observation, last_token=...) -> list[int]   what follows an action, up to the next action
    stop_ids: set[int]                                   tokens that end an action (sampled, kept, loss mask 1)
    pad_id: int                                          filler for batch holes (never attended to)
    decode_action(ids) -> str                            the action text the environment receives

Two formats:

- `TinyFormat` for the embedded default's tiny models, whose byte-level BPE tokenizer (`build_tokenizer`) has five
  special tokens. Layout: `<bos> <obs> first-observation <act>` then the action ending with `<eot>`, then
  `<obs> next-observation <act>`, and so on. Observation text is encoded with special-token parsing switched off
  (`encode_special_tokens`), so an environment that prints "<eot>" cannot inject a control token: the special
  tokens appear only where this layout puts them.
- `HFChatFormat` for real checkpoints: the tokenizer's own chat template. The first observation is the user message
  (after an optional system prompt), followed by the generation prompt. An observation after an action is the
  *token delta* of the templated conversation. How we get a correct delta, and the choices behind it:
    * We render text, not tokens: delta_text = render(msgs + [user obs], generation prompt) minus render(msgs), a
      string suffix, and we check that the longer text really starts with the shorter one (templates that rewrite
      earlier turns, e.g. ones that strip reasoning from past assistant messages, fail this check at construction
      with a clear error instead of silently producing a conversation the model never saw in training).
    * `msgs` is a fixed dummy conversation (a user message and an assistant message), not the real history: the
      delta of a well-behaved template does not depend on earlier content, and the construction-time check with two
      different dummy histories verifies that for this template.
    * The assistant message's closing text (its "tail", e.g. "<|im_end|>\\n" in ChatML) is part of the rendered
      `msgs` but the model generates only its first token (the end-of-turn token, a stop token). So the delta that
      the engine appends is: the rest of the tail after the end-of-turn token when the action ended with it, else
      (cut by the per-turn limit, or ended with another stop token such as EOS) the whole tail, end-of-turn token
      included, as environment tokens. Either way the token sequence equals the template's rendering of the real
      conversation, token for token (tested for ChatML- and Llama-3-style templates), provided the model's action
      tokens are what the tokenizer would produce for that text, and the pieces we encode separately meet at
      special tokens (as in those templates), across which BPE never merges. A template whose assistant tail has
      no special end-of-turn token stops on EOS only, and that EOS then stays in the sequence before the tail.
    * Text is encoded with `add_special_tokens=False`: chat templates write their own BOS.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<obs>", "<act>", "<eot>")
"""The tiny tokenizer's special tokens; `build_tokenizer` gives them ids 0..4 in this order."""


def build_tokenizer(
    texts: Iterable[str], vocab_size: int = 512, min_frequency: int = 2, special_tokens: Iterable[str] = SPECIAL_TOKENS
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on sample texts, with `special_tokens` (default `SPECIAL_TOKENS`, the
    tiny format's) as ids 0..n-1.

    Deterministic: the same texts and sizes give the same tokenizer (`to_str()` identical), whatever the thread
    count. Every byte is in the base alphabet, so any text encodes without unknown tokens. Save with
    `tokenizer.to_str()` / `Tokenizer.from_str(...)`. The vocabulary may end up smaller than `vocab_size` when the
    texts have few repeated pairs: size the model with `tokenizer.get_vocab_size()`.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    special_tokens = list(special_tokens)
    minimum = len(alphabet) + len(special_tokens)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} is below the byte alphabet plus special tokens ({minimum})")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("build_tokenizer: texts must all be str")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=False,
        special_tokens=special_tokens,
        initial_alphabet=alphabet,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


TINY_CHAT_TEMPLATE = (
    "{{- '<bos>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{- message['content'] -}}<eot>"
    "{%- else -%}<obs>{{- message['content'] -}}<act>{%- endif -%}"
    "{%- endfor -%}"
)
"""`TinyFormat`'s layout as a Hugging Face chat template (saved with a tiny policy, so transformers and vLLM render
a conversation as the harness does): every message but the assistant's is an observation, which ends with `<act>`,
so the generation prompt is already there."""


def tiny_tokenizer_config(fmt: TinyFormat) -> dict:
    """tokenizer_config.json of a saved tiny policy: its own special tokens as BOS, EOS (`<eot>`, the stop token)
    and pad, and its chat template; without it, transformers would add a default EOS beyond the model's vocabulary."""
    tokenizer = fmt.tokenizer
    return {
        "tokenizer_class": "TokenizersBackend",  # the tokenizer.json as it is (a model type's own class would rebuild it)
        "bos_token": tokenizer.id_to_token(fmt.bos_id),
        "eos_token": tokenizer.id_to_token(fmt.eot_id),
        "pad_token": tokenizer.id_to_token(fmt.pad_id),
        "unk_token": None,  # byte-level BPE needs none; model-specific classes (Qwen2Tokenizer) would add one
        "additional_special_tokens": [tokenizer.id_to_token(fmt.obs_id), tokenizer.id_to_token(fmt.act_id)],
        "chat_template": TINY_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }


class TinyFormat:
    """`<bos> <obs> text <act>` action `<eot>` `<obs> text <act>` ... for a tokenizer built by `build_tokenizer`."""

    def __init__(self, tokenizer: Tokenizer):
        ids = {name: tokenizer.token_to_id(name) for name in SPECIAL_TOKENS}
        missing = [name for name, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"TinyFormat: tokenizer lacks special tokens {missing} (build it with build_tokenizer)")
        # A private copy, so switching off special-token parsing does not change the caller's tokenizer.
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.encode_special_tokens = True
        self.pad_id, self.bos_id, self.obs_id, self.act_id, self.eot_id = (ids[name] for name in SPECIAL_TOKENS)
        self.stop_ids: set[int] = {self.eot_id}
        self.special_ids: set[int] = set(ids.values())

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode_text(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings in `text` are encoded as ordinary bytes."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def prompt_ids(self, first_observation: str) -> list[int]:
        return [self.bos_id, self.obs_id, *self.encode_text(first_observation), self.act_id]

    def observation_ids(self, observation: str, last_token: int | None = None) -> list[int]:
        """`<obs> text <act>`; the `<obs>` marker closes the action whether or not it ended with `<eot>`."""
        return [self.obs_id, *self.encode_text(observation), self.act_id]

    def action_ids(self, action: str) -> list[int]:
        """What a perfect policy would write for `action` (text then `<eot>`): for warm starts and tests."""
        return [*self.encode_text(action), self.eot_id]

    def decode_action(self, ids: list[int]) -> str:
        """Action text: special tokens (the closing `<eot>` and any stray marker the policy wrote) are dropped."""
        return self.tokenizer.decode([int(i) for i in ids if int(i) not in self.special_ids], skip_special_tokens=False)


_STABLE_HINT = (
    "; give the policy a prefix-stable template (model.chat_template: a Jinja file, or a shipped one: "
    "qwen3-stable for the Qwen3/Qwen3.5 families)"
)


class HFChatFormat:
    """A Hugging Face tokenizer's chat template, rendered incrementally (see the module docstring for the delta)."""

    _USER_A, _ASSISTANT_A = "Hello there.", "Hi! How can I help?"
    _USER_B, _ASSISTANT_B = "Second dummy question, longer.", "Second dummy answer."
    _PROBE = "Probe observation."

    def __init__(
        self,
        hf_tokenizer,
        *,
        system_prompt: str | None = None,
        extra_stop_ids: Iterable[int] = (),
        template_options: dict | None = None,
    ):
        if not getattr(hf_tokenizer, "chat_template", None):
            raise ValueError("HFChatFormat: the tokenizer has no chat_template")
        self.tokenizer = hf_tokenizer
        self.system_prompt = system_prompt
        self.template_options = dict(template_options or {})
        self._head = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []

        # The assistant tail: what the template writes after an assistant message's content.
        history = [
            *self._head,
            {"role": "user", "content": self._USER_A},
            {"role": "assistant", "content": self._ASSISTANT_A},
        ]
        rendered = self._render(history, generation_prompt=False)
        self._history, self._history_text = history, rendered
        at = rendered.rfind(self._ASSISTANT_A)
        if at < 0:
            raise ValueError("HFChatFormat: the template does not write assistant content verbatim")
        self.assistant_tail = rendered[at + len(self._ASSISTANT_A) :]
        tail_ids = self._encode(self.assistant_tail)
        special = set(getattr(hf_tokenizer, "all_special_ids", [])) | set(
            getattr(hf_tokenizer, "added_tokens_decoder", {}).keys()
        )
        self.end_of_turn_id: int | None = tail_ids[0] if tail_ids and tail_ids[0] in special else None
        self._tail_after_stop = self.assistant_tail
        if self.end_of_turn_id is not None:
            eot_text = hf_tokenizer.decode([self.end_of_turn_id])
            if not self.assistant_tail.startswith(eot_text):
                raise ValueError(
                    f"HFChatFormat: the assistant tail {self.assistant_tail!r} does not start with the "
                    f"text of its end-of-turn token {eot_text!r}"
                )
            self._tail_after_stop = self.assistant_tail[len(eot_text) :]

        stops = set(int(i) for i in extra_stop_ids)
        if hf_tokenizer.eos_token_id is not None:
            stops.add(int(hf_tokenizer.eos_token_id))
        if self.end_of_turn_id is not None:
            stops.add(int(self.end_of_turn_id))
        if not stops:
            raise ValueError("HFChatFormat: no stop token (no EOS, no end-of-turn token, no extra_stop_ids)")
        self.stop_ids: set[int] = stops
        pad = hf_tokenizer.pad_token_id
        self.pad_id: int = int(pad if pad is not None else min(stops))

        # The delta must not depend on the history it follows: compare two different dummy histories.
        longer = history + [
            {"role": "user", "content": self._USER_B},
            {"role": "assistant", "content": self._ASSISTANT_B},
        ]
        if self._delta_text(self._PROBE, history) != self._delta_text(self._PROBE, longer):
            raise ValueError(
                "HFChatFormat: the template renders a new user message differently depending on the "
                "history, so observations cannot be appended incrementally" + _STABLE_HINT
            )

    @property
    def vocab_size(self) -> int:
        """Size the model's embedding needs: every id the tokenizer can produce, added tokens included."""
        return len(self.tokenizer)

    # -- rendering ------------------------------------------------------------------------------------------

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **self.template_options
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _delta_text(self, observation: str, history: list[dict], before: str | None = None) -> str:
        before = self._render(history, generation_prompt=False) if before is None else before
        after = self._render(history + [{"role": "user", "content": observation}], generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "HFChatFormat: the template rewrites earlier turns when a user message is added "
                "(rendered text is not a prefix), so observations cannot be appended incrementally" + _STABLE_HINT
            )
        return after[len(before) :]

    # -- the format interface -------------------------------------------------------------------------------

    def prompt_ids(self, first_observation: str) -> list[int]:
        return self._encode(
            self._render([*self._head, {"role": "user", "content": first_observation}], generation_prompt=True)
        )

    def observation_ids(self, observation: str, last_token: int | None = None) -> list[int]:
        """Tokens that follow an action: the rest of the assistant tail, the user message, the generation prompt.

        `last_token` is the action's last token. When it is the template's end-of-turn token, the tail after it
        follows; otherwise (the action was cut by a length limit, or ended with EOS) the whole tail does.
        """
        ended = last_token is not None and last_token == self.end_of_turn_id
        tail = self._tail_after_stop if ended else self.assistant_tail
        return self._encode(tail + self._delta_text(observation, self._history, self._history_text))

    def action_ids(self, action: str) -> list[int]:
        """What a perfect policy would write for `action`: its tokens then the end-of-turn (or EOS) token."""
        stop = self.end_of_turn_id if self.end_of_turn_id is not None else self.tokenizer.eos_token_id
        return [*self._encode(action), int(stop)]

    def decode_action(self, ids: list[int]) -> str:
        ids = [int(i) for i in ids]
        while ids and ids[-1] in self.stop_ids:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=True)
