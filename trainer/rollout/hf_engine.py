"""Hugging Face rollout engine: many multi-turn episodes decoded in one batch, each with a KV cache kept across turns.

`HFEngine.play(envs, tasks, sampling=...)` plays one episode per (environment, task) pair. All episodes advance
together, one sampled token per episode per step. When an episode's action ends (a stop token, or the per-turn
limit), its text goes to `env.step`, and the next observation's tokens are *appended to that episode's cache* by a
forward pass over just those tokens; nothing is ever re-encoded from the start. The result is one `Episode` record
per pair with per-token loss mask, rollout log-prob, policy version and turn index.

Design choices:

- **One KV buffer, each row left-aligned at its own length.** Episodes in a batch have different lengths, and as
  turns end at different steps they append different numbers of tokens. A shared cache in which every forward pass
  appends the same number of columns to every row (what `DynamicCache` does) would fill with holes: each
  observation prefill of one episode would add ~30 dead columns to all the others, every turn. Instead `_RowCache`
  keeps buffers `[rows, kv_heads, capacity, head_dim]` in which row r holds exactly its own tokens at columns
  `0..L_r-1` (column = position), and each forward pass *scatters* the new keys/values of row r to columns
  `L_r, L_r+1, ...`. Nothing accumulates, nothing is compacted, and the buffers grow by doubling (no
  `torch.cat` of the whole cache per token). The attention mask is a custom 4-D additive mask, "key column <= the
  query's column", which transformers passes through unchanged to the `eager` and `sdpa` kernels.
- **Right-aligned chunks.** In a pass where rows feed different numbers of tokens (width W = the longest), row r's
  n_r real tokens sit at the *end* of its chunk, so the last position is real for every row and one
  `logits_to_keep=1` projection gives every row's next-token logits. The W - n_r filler slots are written to the
  columns just after the real ones (`L_r + n_r ...`), where they are never attended by a real query and are
  overwritten later; a filler query sees at least its own key, so no attention row is fully masked (no NaN).
- **Two passes per step at most.** Rows that feed one token (they are mid-action) share a decode pass over the whole
  buffer (a view, no copy). Rows that feed an observation (their action just ended; they feed its last token and
  the observation) share one prefill pass over just those rows, so a 30-token observation costs 30 positions for
  that episode, not 30 for every episode in the batch.
- **Finished episodes leave the batch** (`free_finished=True`, the default): their rows are dropped from the
  buffers with one `index_select`. Keeping them as filler rows (`free_finished=False`) is slower, because every
  decode pass still computes them (`benchmarks/bench_rollout.py --mask-finished` measures both).
- **A lean forward for the tiny families.** For Llama, Qwen2 and Qwen3 models on the sdpa kernel (the embedded
  study's policies), `LeanDecoder.step` (trainer/policy/lean.py) replaces the transformers call with the same
  arithmetic in fewer ops, so logits, sampled tokens and log-probs are bit-identical (tested against `lean=False`).
  What remains is mostly MKL's small-row matmuls and the attention kernel, which cannot change without changing
  the numbers (a matmul's rows depend on how many rows it is given, so no pass may drop or add rows either). Other
  models, and `attn_implementation="eager"`, take the generic call.
- **Log-probs.** The trainer recomputes log-probs from temperature-scaled logits over the full vocabulary, so the
  rollout log-prob of a sampled token is `log_softmax(logits / temperature)[token]`: top-p only restricts which
  token may be drawn, it does not renormalise the recorded probability. Greedy decoding (`temperature == 0`)
  records the log-prob under temperature 1.
- **Token budgets.** `max_turn_tokens` caps one action (the action is then executed as it stands, without a stop
  token). `max_episode_tokens` caps the whole sequence: if an action would grow the episode past it, the action is
  cut there and *not* executed (it is recorded as the last turn and action; no observation follows it), and if the
  observation after an executed action would not leave room for one more token it is recorded as text but not
  appended. Either way the episode ends with `truncated=True`, `done=False`, and the environment's
  `truncated_reward()` (0 where it has none; `episode.end_actions`). An episode whose prompt leaves no room for
  one token is not played: it comes back marked skipped (`episode.skip_if_prompt_too_long`).
- **Loss mask.** 1 exactly on sampled tokens, the stop token that closes an action included; 0 on the prompt,
  observations and any template text the format inserts (see trainer/policy/chat_format.py).

Models served: decoder-only, `attn_implementation` "sdpa" or "eager" (the custom mask); anything else (flash
attention) is refused with a clear error. Models with layers other than full attention (Qwen3.5's Gated DeltaNet
linear attention, sliding windows) are served without a cache: every step feeds each live row its whole sequence
(left-padded, with an attention mask) and reads the last position's logits, so the model's own layers do all the
work, at O(T^2) cost: right for the tiny CPU models; paper-scale hybrid rollouts belong to vLLM.
Written against transformers 5.x's layered `Cache` API (`CacheLayerMixin`); the model's cache argument is found
by name (`cache`, or `past_key_values` in earlier 5.x releases).

The engine leaves environments open (their owner closes them). It is synchronous; the asynchronous driver calls
`play` and publishes new weights between calls with `load_state_dict`. The environment calls go through the
`pool` the owner passes (trainer/rollout/env_pool.py): all resets side by side, then in each step the actions that
ended in it side by side, and the next forward pass waits for all of them, so the episodes are the same for every
pool width.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from trainer.environments.protocol import Environment, EpisodeStartError
from trainer.policy.lean import LeanDecoder
from trainer.rollout.env_pool import SEQUENTIAL, EnvPool
from trainer.rollout.episode import (
    ActionEnd,
    Episode,
    end_actions,
    mark_failed,
    skip_if_prompt_too_long,
    start_episode,
)
from trainer.rollout.sampling import SamplingParams


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of `logits` [n, vocab]; returns (tokens [n], log-probs [n], fp32).

    The log-prob is `log_softmax(logits / temperature)[token]` over the full vocabulary (temperature 1 when
    greedy); top-p only restricts the draw to the smallest set of most likely tokens whose mass reaches top_p.
    """
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, mass_before < top_p)
        probs = probs.masked_fill(~keep, 0.0)
    draw_on = generator.device if generator is not None else probs.device
    tokens = torch.multinomial(probs.to(draw_on), 1, generator=generator)[:, 0].to(logits.device)
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]


# ------------------------------------------------------------------------------------------- the KV cache


@dataclass
class _Plan:
    """Where the current forward pass reads and writes; set by the engine before every pass, read by every layer."""

    n_rows: int = 0
    capacity: int = 0
    rows: torch.Tensor | None = None
    """Buffer rows taking part in this pass; None = all rows, in order (then keys are a view, not a copy)."""
    row_index: torch.Tensor | None = None
    """[n, 1] row of each input row, for the scatter."""
    cols: torch.Tensor | None = None
    """[n, W] buffer column (= position) each input slot is written to."""
    kv_len: int = 0
    """Columns the attention reads: max over the pass's rows of the last written column, plus one."""


class _RowLayer(CacheLayerMixin):
    """One layer's keys and values: buffers [rows, kv_heads, capacity, head_dim], row r valid at columns < L_r."""

    is_sliding = False

    def __init__(self, plan: _Plan):
        super().__init__()
        self.plan = plan

    def lazy_initialization(self, key_states, value_states):
        shape = (self.plan.n_rows, key_states.shape[1], self.plan.capacity, key_states.shape[-1])
        self.keys = key_states.new_zeros(shape)
        self.values = value_states.new_zeros(shape[:3] + (value_states.shape[-1],))
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.plan
        self.keys[plan.row_index, :, plan.cols] = key_states.transpose(1, 2)
        self.values[plan.row_index, :, plan.cols] = value_states.transpose(1, 2)
        keys, values = self.keys[:, :, : plan.kv_len], self.values[:, :, : plan.kv_len]
        if plan.rows is not None:
            keys, values = keys.index_select(0, plan.rows), values.index_select(0, plan.rows)
        return keys, values

    def grow(self, capacity: int):
        if self.is_initialized and self.keys.shape[2] < capacity:
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_zeros(old.shape[:2] + (capacity,) + old.shape[3:])
                new[:, :, : old.shape[2]] = old
                setattr(self, name, new)

    def keep_rows(self, rows: torch.Tensor):
        if self.is_initialized:
            self.keys, self.values = self.keys.index_select(0, rows), self.values.index_select(0, rows)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.plan.kv_len, 0

    def get_seq_length(self) -> int:
        return self.plan.kv_len

    def get_max_length(self) -> int:
        return -1


class _RowCache(Cache):
    """Per-row KV buffers for all layers, plus the plan of the next forward pass."""

    def __init__(self, n_layers: int, n_rows: int, capacity: int):
        self.plan = _Plan(n_rows=n_rows, capacity=capacity)
        super().__init__(layers=[_RowLayer(self.plan) for _ in range(n_layers)])

    def reserve(self, capacity: int):
        """Make room for columns < capacity (doubling, so growth costs O(1) per token amortised)."""
        if capacity > self.plan.capacity:
            self.plan.capacity = max(capacity, 2 * self.plan.capacity)
            for layer in self.layers:
                layer.grow(self.plan.capacity)

    def keep_rows(self, rows: list[int], device):
        index = torch.tensor(rows, dtype=torch.long, device=device)
        for layer in self.layers:
            layer.keep_rows(index)
        self.plan.n_rows = len(rows)


# ------------------------------------------------------------------------------------------- the engine


@dataclass
class _Row:
    """One episode in flight."""

    episode: Episode
    env: Environment
    state: str
    """The observation the current action is taken in."""
    pending: list[int]
    """Tokens already in the episode but not yet in the cache (fed by the next pass)."""
    fed: int = 0
    """Tokens in this row's cache: columns 0..fed-1."""
    turn: int = 0
    action: list[int] = field(default_factory=list)
    action_logp: list[float] = field(default_factory=list)
    finished: bool = False


class HFEngine:
    """Plays batches of multi-turn episodes with a Hugging Face causal LM; see the module docstring."""

    def __init__(
        self,
        model,
        fmt,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        free_finished: bool = True,
        lean: bool = True,
    ):
        """`model` is used in place (moved to device/dtype, put in eval mode): give the engine its own copy if a
        trainer keeps updating the original. `fmt` is a format from trainer/policy/chat_format.py (TinyFormat,
        HFChatFormat).
        `lean=False` calls the transformers model even where `LeanDecoder` serves it (tests compare the two)."""
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("HFEngine needs a decoder-only causal LM, got an encoder-decoder model")
        attn = getattr(config, "_attn_implementation", None)
        if attn not in ("sdpa", "eager"):
            raise ValueError(
                f"HFEngine needs attn_implementation 'sdpa' or 'eager' (it passes a custom 4-D mask), got {attn!r}"
            )
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
        self.uncached = any(t != "full_attention" for t in layer_types)
        """Hybrid layers: no row cache, whole sequences every step (see the module docstring)."""
        for name in ("stop_ids", "pad_id"):
            if not hasattr(fmt, name):
                raise TypeError(f"HFEngine: format {type(fmt).__name__} has no {name!r}")
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=dtype) if dtype is not None else model.to(self.device)
        self.model.eval()
        self.dtype = next(self.model.parameters()).dtype
        self.fmt = fmt
        self.free_finished = free_finished
        self.n_layers = int(text_config.num_hidden_layers)
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._lean = LeanDecoder(self.model) if lean and not self.uncached and LeanDecoder.serves(self.model) else None
        self.policy_version = 0
        self.last_stats: dict[str, int] = {}
        """Counters of the last `play`: steps, decode/prefill passes, tokens fed, filler slots computed."""

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        """Publish new weights (copied into the engine's model, cast to its dtype and device) as `version`."""
        with torch.no_grad():
            self.model.load_state_dict(state_dict)
        self.policy_version = int(version)

    # -- one forward pass -------------------------------------------------------------------------------------

    def _forward_whole(self, sequences: list[list[int]]) -> torch.Tensor:
        """Next-token logits [len(sequences), vocab] (fp32) after each whole sequence, left-padded in one batch."""
        width = max(len(q) for q in sequences)
        pad = int(self.fmt.pad_id)
        ids = torch.tensor([[pad] * (width - len(q)) + list(q) for q in sequences], device=self.device)
        mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in sequences], device=self.device)
        out = self.model(input_ids=ids, attention_mask=mask, use_cache=False, **self._keep_kw)
        return out.logits[:, -1].float()

    def _forward(
        self, cache: _RowCache, chunks: list[list[int]], starts: list[int], rows: list[int] | None
    ) -> torch.Tensor:
        """Feed `chunks[i]` to buffer row `rows[i]` (all rows when None) starting at column `starts[i]`.

        Returns the next-token logits [len(chunks), vocab] after each chunk's last token (fp32).
        """
        n, width = len(chunks), max(len(c) for c in chunks)
        pad = int(self.fmt.pad_id)
        ids = [[pad] * (width - len(c)) + list(c) for c in chunks]
        # Slot j of a chunk of n_r real tokens: real when j >= width - n_r, written at start + (j - (width - n_r));
        # filler slots go after the real ones: start + n_r + j. Both are start + ((j - width + n_r) mod width).
        cols = [[s + (j - width + len(c)) % width for j in range(width)] for c, s in zip(chunks, starts)]
        device = self.device
        ids_t = torch.tensor(ids, dtype=torch.long, device=device)
        cols_t = torch.tensor(cols, dtype=torch.long, device=device)
        kv_len = max(s + width for s in starts)
        cache.reserve(kv_len)
        plan = cache.plan
        plan.cols, plan.kv_len = cols_t, kv_len
        if rows is None:
            plan.rows, plan.row_index = None, torch.arange(n, device=device)[:, None]
        else:
            plan.rows = torch.tensor(rows, dtype=torch.long, device=device)
            plan.row_index = plan.rows[:, None]
        allowed = torch.arange(kv_len, device=device)[None, None, :] <= cols_t[:, :, None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        if self._lean is not None:
            return self._lean.step(ids_t, cols_t, mask[:, None], cache).float()
        out = self.model(
            input_ids=ids_t,
            position_ids=cols_t,
            attention_mask=mask[:, None],
            use_cache=True,
            **{self._cache_kw: cache},
            **self._keep_kw,
        )
        return out.logits[:, -1].float()

    # -- playing ----------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def play(
        self,
        envs: list[Environment],
        tasks: list,
        *,
        sampling: SamplingParams,
        policy_version: int | None = None,
        generator: torch.Generator | None = None,
        task_ids: list[str] | None = None,
        baselines: list[float | None] | None = None,
        pool: EnvPool = SEQUENTIAL,
    ) -> list[Episode]:
        """Play one episode per (env, task) pair, all in one batch; returns the episodes in input order.

        `policy_version` (default: the engine's `policy_version`) is recorded on every sampled token and as the
        episodes' dispatch version. `generator` seeds the sampling (same seed, same episodes). `task_ids` defaults
        to each task's `task_id` attribute (else `str(task)`); `baselines` (SPO++) is copied onto the episodes.
        `pool` runs the environment calls (the resets, and the actions that end in one step) side by side; the
        episodes are the same for every width.
        """
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"play: sampling must be a SamplingParams, got {type(sampling).__name__}")
        n = len(envs)
        if len(tasks) != n:
            raise ValueError(f"play: {n} envs but {len(tasks)} tasks")
        if task_ids is not None and len(task_ids) != n:
            raise ValueError(f"play: {n} envs but {len(task_ids)} task_ids")
        if baselines is not None and len(baselines) != n:
            raise ValueError(f"play: {n} envs but {len(baselines)} baselines")
        if n == 0:
            return []
        version = self.policy_version if policy_version is None else int(policy_version)
        self.model.eval()

        rows: list[_Row] = []
        episodes: list[Episode] = []
        firsts = pool.map(lambda k: start_episode(envs[k], tasks[k]), range(n))
        for i, (env, task, first) in enumerate(zip(envs, tasks, firsts)):
            task_id = task_ids[i] if task_ids is not None else str(getattr(task, "task_id", task))
            episode = Episode(
                task_id=task_id, dispatch_version=version, baseline=None if baselines is None else baselines[i]
            )
            episodes.append(episode)
            if isinstance(first, EpisodeStartError):
                mark_failed(episode, str(first))
                continue
            episode.observations.append(first)
            prompt = [int(t) for t in self.fmt.prompt_ids(first)]
            if skip_if_prompt_too_long(episode, prompt, sampling.max_episode_tokens):
                continue
            episode.append(prompt, policy=False)
            rows.append(_Row(episode=episode, env=env, state=first, pending=prompt))
        if not rows:
            return episodes

        longest = max(len(r.pending) for r in rows)
        cache = (
            None
            if self.uncached
            else _RowCache(
                self.n_layers,
                n_rows=len(rows),
                capacity=min(longest + sampling.max_turn_tokens + 64, sampling.max_episode_tokens + longest),
            )
        )
        stop_ids = {int(t) for t in self.fmt.stop_ids}
        stats = dict(steps=0, decode_passes=0, prefill_passes=0, tokens_fed=0, filler_slots=0)

        while True:
            live = [i for i, r in enumerate(rows) if not r.finished]
            if not live:
                break
            decode = [i for i in live if len(rows[i].pending) == 1]
            decoding = set(decode)
            prefill = [i for i in live if len(rows[i].pending) > 1]
            order, logits = [], []
            if self.uncached:  # whole sequences: the episode so far and the action being generated
                logits.append(self._forward_whole([rows[i].episode.tokens + rows[i].action for i in live]))
                order, decode, prefill = list(live), [], []
                stats["prefill_passes"] += 1
            if decode:
                # Every buffer row takes part (a view of the buffers); rows not decoding feed one filler slot at
                # their next free column, which a prefill pass below or nothing at all will overwrite.
                chunks = [r.pending if i in decoding else [self.fmt.pad_id] for i, r in enumerate(rows)]
                logits.append(self._forward(cache, chunks, [r.fed for r in rows], rows=None)[decode])
                order += decode
                stats["decode_passes"] += 1
                stats["filler_slots"] += len(rows) - len(decode)
            if prefill:
                chunks = [rows[i].pending for i in prefill]
                everyone = len(prefill) == len(rows)
                logits.append(
                    self._forward(cache, chunks, [rows[i].fed for i in prefill], rows=None if everyone else prefill)
                )
                order += prefill
                stats["prefill_passes"] += 1
                width = max(len(c) for c in chunks)
                stats["filler_slots"] += sum(width - len(c) for c in chunks)
            for i in order:
                rows[i].fed += len(rows[i].pending)
                stats["tokens_fed"] += len(rows[i].pending)
                rows[i].pending = []
            tokens, logps = sample_tokens(torch.cat(logits), sampling.temperature, sampling.top_p, generator)
            ending = []
            for i, token, logp in zip(order, tokens.tolist(), logps.tolist()):
                end = self._advance(rows[i], token, logp, sampling, stop_ids, version)
                if end is not None:
                    ending.append((rows[i], end))
            if ending:  # the actions that ended this step run side by side; the next pass waits for all of them
                answers = end_actions(
                    [end for _, end in ending], fmt=self.fmt, max_episode_tokens=sampling.max_episode_tokens, pool=pool
                )
                for (row, _), obs in zip(ending, answers):
                    self._next_turn(row, obs)
            stats["steps"] += 1

            if self.free_finished and any(r.finished for r in rows):
                keep = [i for i, r in enumerate(rows) if not r.finished]
                if keep and cache is not None:
                    cache.keep_rows(keep, self.device)
                rows = [rows[i] for i in keep]
        self.last_stats = stats
        return episodes

    def _advance(
        self, row: _Row, token: int, logp: float, sampling: SamplingParams, stop_ids: set[int], version: int
    ) -> ActionEnd | None:
        """Take one sampled token: continue the action (None), or end it (what `end_actions` takes)."""
        row.action.append(token)
        row.action_logp.append(logp)
        stopped = token in stop_ids
        turn_over = stopped or len(row.action) >= sampling.max_turn_tokens
        if not turn_over and row.episode.length + len(row.action) < sampling.max_episode_tokens:
            row.pending = [token]
            return None
        return ActionEnd(
            row.episode,
            row.env,
            row.action,
            row.action_logp,
            row.state,
            version,
            row.turn,
            execute=turn_over,
            stopped=stopped,
        )

    @staticmethod
    def _next_turn(row: _Row, obs: list[int] | None) -> None:
        """After `end_actions`: feed the action's last token and the observation next, or finish the row."""
        if obs is None:
            row.finished = True
            return
        row.pending = [row.action[-1]] + obs
        row.state = row.episode.observations[-1]
        row.turn += 1
        row.action, row.action_logp = [], []
