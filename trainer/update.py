"""One policy update from a batch of finished episodes: old log-probs, loss, clipping, optimizer step.

Why it is shaped this way:
* Old log-probs are recomputed with the trainer's weights before any step, so the PPO ratio compares against the
  training engine, and TIS compares that with what the rollout engine reported (the paper's two-policy setup).
* Micro-batches by token budget keep memory flat on long episodes; each micro-batch's loss is rescaled so the sum
  over micro-batches equals the loss of the whole mini-batch under every aggregation (tested), and gradient
  accumulation changes nothing but memory.
* Gradient clipping acts on the raw gradients, before the optimizer; Muon then orthogonalises the momentum, so the
  clip never touches (or pins) the orthogonalised update.
* A non-finite loss or gradient skips the step and is logged, since a NaN is itself a collapse signal.
* A mini-batch whose advantages are all zero carries no signal: its policy gradient is exactly zero, yet
  momentum (Muon's, Adam's first moment) would still move the weights. With `skip_no_signal` such a step is
  skipped and counted, so an all-fail batch leaves the policy where it was.
* PPO as verl runs it: `epochs` passes over the batch, each split into `minibatches` optimizer steps, against
  old log-probs taken once before the first step; the ratio moves away from 1 after the first step, so the clip
  binds.
* Sharded (`ctx`, see `trainer/distributed.py`): every rank holds the whole batch and takes the rows i with
  i mod N = rank; the totals the aggregations divide by come from the whole mini-batch, so they are global without
  communication; every rank runs the same number of micro-batches (zero-weight stand-ins where it has fewer).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from trainer.config import RunConfig
from trainer.distributed import SINGLE, DistContext
from trainer.optim.config import OptimConfig
from trainer.optim.muon import matrix_update_stats
from trainer.policy.lean import lean_decoder
from trainer.rl.config import LossConfig
from trainer.rl.loss import policy_loss, token_entropy_from_logits
from trainer.rollout.config import RolloutConfig
from trainer.rollout.episode import Episode


@dataclass
class PaddedBatch:
    """Episodes as right-padded tensors. Per-token arrays are aligned to targets = tokens[:, 1:]."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1]
    rollout_logp: torch.Tensor  # [B, T-1]
    versions: torch.Tensor  # [B, T-1], -1 off the mask

    @property
    def width(self) -> int:
        return self.loss_mask.shape[1]

    def to(self, device) -> PaddedBatch:
        return PaddedBatch(
            *(
                t.to(device)
                for t in (self.input_ids, self.attention_mask, self.loss_mask, self.rollout_logp, self.versions)
            )
        )


def pad_episodes(episodes: list[Episode], pad_id: int) -> PaddedBatch:
    T = max(e.length for e in episodes)
    B = len(episodes)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.float32)
    rlp = torch.zeros(B, T, dtype=torch.float32)
    ver = torch.full((B, T), -1, dtype=torch.long)
    for i, e in enumerate(episodes):
        n = e.length
        ids[i, :n] = torch.tensor(e.tokens)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
        rlp[i, :n] = torch.tensor(e.rollout_logp, dtype=torch.float32)
        ver[i, :n] = torch.tensor(e.versions)
    if bool(mask[:, 0].any()):
        raise ValueError("an episode starts with a policy token; the first token must be part of the prompt")
    return PaddedBatch(ids, attn, mask[:, 1:], rlp[:, 1:], ver[:, 1:])


def slice_batch(batch: PaddedBatch, rows: slice | list[int]) -> PaddedBatch:
    """Rows of a batch, trimmed to their own longest sequence."""
    attn = batch.attention_mask[rows]
    T = int(attn.sum(1).max())
    return PaddedBatch(
        batch.input_ids[rows][:, :T],
        attn[:, :T],
        batch.loss_mask[rows][:, : T - 1],
        batch.rollout_logp[rows][:, : T - 1],
        batch.versions[rows][:, : T - 1],
    )


@dataclass(frozen=True)
class ForwardSettings:
    """How the update's forward passes run, as the trainer resolves them from the cell's `run` section once."""

    autocast_dtype: torch.dtype | None = None
    """Autocast's dtype (`run.compute_dtype`; None: the parameters' dtype, and a sharded update, which computes in
    FSDP2's mixed precision instead)."""
    chunk_tokens: int | None = None
    """`run.logprob_chunk_tokens`: the LM head this many positions at a time (None: all at once)."""


PLAIN_FORWARD = ForwardSettings()
"""No autocast, the LM head at once."""


def flash_attention_refusal(
    device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int
) -> str | None:
    """Why the flash kernel would not take the update's attention (causal, no mask, `dtype`, this head shape), or None.

    A check of the kernel's conditions rather than `sdpa_kernel(FLASH_ATTENTION)` around the forward: that context
    sets process-wide flags, so in async mode it also barred the rollout thread's masked attention from every kernel
    ("No available kernel. Aborting execution.", seen on an H200)."""
    from torch.backends.cuda import SDPAParams, can_use_flash_attention

    q = torch.zeros(1, heads, 8, head_dim, device=device, dtype=dtype)
    kv = torch.zeros(1, kv_heads, 8, head_dim, device=device, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = can_use_flash_attention(SDPAParams(q, kv, kv, None, 0.0, True, heads != kv_heads), True)
    return None if ok else ("; ".join(str(w.message) for w in caught) or "the kernel's conditions are not met")


def check_flash_attention(model: nn.Module, device: torch.device, compute_dtype: torch.dtype | None) -> None:
    """Raise if the flash kernel cannot take the update's attention (`run.require_flash_attention`): once, when the
    trainer starts, since the model's heads and the dtype attention computes in (`compute_dtype`: autocast's, or a
    sharded update's FSDP2 mixed precision, whose parameters stay fp32; None: the parameters') do not change."""
    if device.type != "cuda":
        return
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype = compute_dtype or next(model.parameters()).dtype
    why = flash_attention_refusal(device, dtype, heads, getattr(config, "num_key_value_heads", None) or heads, head_dim)
    if why is not None:
        raise RuntimeError(
            f"run.require_flash_attention: the flash kernel cannot take this model's attention in "
            f"{dtype} ({heads} heads of {head_dim}): {why}. Without it attention falls back to a kernel "
            "whose scores grow with the square of the episode's length; set "
            "run.require_flash_attention: false to allow that."
        )


def _head_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        return logp, token_entropy_from_logits(logits.detach())


def _chunk_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    autocast_dtype: torch.dtype | None,
):
    ctx = (
        torch.autocast(hidden.device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with ctx:
        logits = head(hidden)
    logp, entropy = _head_logprobs(logits, targets, temperature, with_entropy)
    return logp if entropy is None else (logp, entropy)


def token_logprobs(
    model: nn.Module,
    batch: PaddedBatch,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    forward: ForwardSettings = PLAIN_FORWARD,
):
    """log pi(token_t | tokens_<t) for t >= 1, [B, T-1] fp32 (and the per-token entropy if asked).

    With `forward.chunk_tokens` the model returns only its final hidden states (plus one position's logits) and
    the LM head runs over chunks of positions, each chunk recomputed in the backward pass
    (`torch.utils.checkpoint`), so at most one chunk's logits exist at a time."""
    autocast_dtype, chunk = forward.autocast_dtype, forward.chunk_tokens
    ctx = (
        torch.autocast(batch.input_ids.device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    # No attention mask: rows are right-padded (pad_episodes), so under causal attention a real position never sees
    # a pad, and the mask would change only the pad positions (which every caller masks out). Without it attention
    # takes the causal kernel; on CPU the masked path is several times slower.
    targets = batch.input_ids[:, 1:]
    # Scoring without gradients takes the lean forward where it serves the model (the same logits, fewer ops)
    lean = lean_decoder(model) if chunk is None and autocast_dtype is None and not torch.is_grad_enabled() else None
    with ctx:
        if lean is not None:
            logits = lean.logits(batch.input_ids)[:, :-1]
        elif chunk is None:
            logits = model(input_ids=batch.input_ids).logits[:, :-1]
        else:
            hidden = model(input_ids=batch.input_ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1][
                :, :-1
            ]
    if chunk is None:
        logp, entropy = _head_logprobs(logits, targets, temperature, with_entropy)
        return logp if not with_entropy else (logp, entropy)
    from torch.utils.checkpoint import checkpoint

    head = model.get_output_embeddings()
    parts = [
        checkpoint(
            _chunk_logprobs,
            head,
            hidden[:, s : s + chunk],
            targets[:, s : s + chunk],
            temperature,
            with_entropy,
            autocast_dtype,
            use_reentrant=False,
        )
        for s in range(0, hidden.shape[1], chunk)
    ]
    if not with_entropy:
        return torch.cat(parts, dim=1)
    return torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1)


def score_sequences(
    model: nn.Module,
    sequences: list[tuple[list[int], list[int]]],
    pad_id: int,
    temperature: float = 1.0,
    *,
    device: str | torch.device = "cpu",
    forward: ForwardSettings = PLAIN_FORWARD,
) -> torch.Tensor:
    """log pi of each (tokens, loss mask) sequence's tokens under `model`, [R, T-1] fp32 on the CPU (row r is valid up
    to len(tokens_r) - 1), one no-grad forward pass per sequence: no padding is computed, and a row's numbers do
    not depend on what else is scored with it (as the update's one-episode micro-batches). On CPU that is ~1.4x
    faster than one padded pass over all of them (`benchmarks/profile_cell.py`, phase `spo/old_logp`).

    SPO's KL-adaptive forgetting re-scores the responses of the tasks an update revisits with this."""
    out = torch.zeros(len(sequences), max((len(tokens) for tokens, _ in sequences), default=1) - 1)
    with torch.no_grad():
        for r, (tokens, mask) in enumerate(sequences):
            e = Episode(task_id="")
            e.tokens, e.loss_mask = list(tokens), list(mask)
            e.rollout_logp, e.versions = [0.0] * len(tokens), [0] * len(tokens)
            row = pad_episodes([e], pad_id).to(device)
            out[r, : row.width] = token_logprobs(model, row, temperature, forward=forward)[0].cpu()
    return out


def micro_batches(batch: PaddedBatch, rows: list[int], token_budget: int) -> list[list[int]]:
    """Greedy packing of `rows` (in order) so that rows x longest length stays within `token_budget`."""
    lengths = batch.attention_mask.sum(1).tolist()
    groups, current, longest = [], [], 0
    for r in rows:
        new_longest = max(longest, lengths[r])
        if current and new_longest * (len(current) + 1) > token_budget:
            groups.append(current)
            current, new_longest = [], lengths[r]
        current.append(r)
        longest = new_longest
    if current:
        groups.append(current)
    return groups


def rank_micro_batches(
    batch: PaddedBatch, rows: list[int], token_budget: int, ctx: DistContext
) -> list[tuple[list[int], float]]:
    """(rows, weight) micro-batches of this rank's share of `rows`; under `ctx` every rank gets as many, a rank
    with fewer padding its list with weight-0 passes over one stand-in row (rows[0]), so no rank waits forever in a
    collective another never enters. Weight 1 for real micro-batches."""
    mine = rows[ctx.rank :: ctx.world_size] if ctx.enabled else rows
    groups = [(g, 1.0) for g in micro_batches(batch, mine, token_budget)]
    if ctx.enabled and rows:
        wanted = int(ctx.all_max([len(groups)])[0])
        groups += [([rows[0]], 0.0)] * (wanted - len(groups))
    return groups


def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) tensor gathered whole; any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _agg_weight(agg: str, mb: PaddedBatch, totals: dict) -> float:
    """Factor that turns a micro-batch's aggregated loss into its share of the mini-batch loss."""
    if agg == "token-mean":
        return float(mb.loss_mask.sum()) / max(totals["tokens"], 1.0)
    if agg in ("seq-mean-token-mean", "seq-mean-token-sum"):  # both average over non-empty rows (loss.py)
        return float((mb.loss_mask.sum(1) > 0).sum()) / max(totals["nonempty_rows"], 1.0)
    return 1.0  # seq-mean-token-sum-norm divides by a global width passed as loss_scale_factor


def _part_share(agg: str, part: PaddedBatch, totals: dict) -> float:
    """A part's share of the step's loss, so that (its gradient contribution) / share estimates the full gradient:
    its tokens under token-mean, its non-empty rows under the seq-mean modes (seq-mean-token-sum-norm too, whose
    sum over a fixed width weighs each row alike)."""
    return _agg_weight("token-mean" if agg == "token-mean" else "seq-mean-token-mean", part, totals)


def policy_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: PaddedBatch,
    advantages: torch.Tensor,
    loss_cfg: LossConfig,
    *,
    temperature: float = RolloutConfig.temperature,
    minibatches: int = RunConfig.minibatches,
    epochs: int = RunConfig.epochs,
    micro_batch_tokens: int = RunConfig.micro_batch_tokens,
    grad_clip: float | None = OptimConfig.grad_clip,
    stat_matrices: list[torch.Tensor] | None = None,
    embed_head_matrices: list[torch.Tensor] | None = None,
    return_old_logp: bool = False,
    grad_parts: list[list[int]] | None = None,
    skip_no_signal: bool = RunConfig.skip_no_signal,
    ctx: DistContext = SINGLE,
    forward: ForwardSettings = PLAIN_FORWARD,
) -> dict:
    """Run `epochs` x `minibatches` optimizer steps over the batch (the settings' defaults are their config knobs':
    `run.*`, `optim.grad_clip`, `rollout.temperature`); returns metrics averaged over steps
    (token-weighted), "steps" (optimizer steps taken), "skipped_steps" (steps skipped: no signal, or a
    non-finite loss or gradient) and "no_signal_steps" (mini-batches whose advantages are all zero, taken or not).

    With `return_old_logp`, also "old_logp_rows": each episode's pre-update trainer log-probs (a list per row),
    which SPO's KL-adaptive forgetting compares against at the task's next visit.
    With `grad_parts` (a partition of the rows, e.g. the task groups) and `stat_matrices`, also "grad_snr": each
    part is back-propagated on its own and `gradient_snr` compares the parts' gradients of those matrices (the
    summed gradient, and so the step, is the same up to round-off).
    The steps' size is measured on `stat_matrices` (the hidden matrices: "update_rms", "update_spectral_norm") and
    on `embed_head_matrices` (the embedding and head, AdamW-trained under either optimizer: "embed_head_update_rms",
    "embed_head_update_spectral_norm"): the RMS over all entries and the largest top singular value of one step,
    averaged / maximised over the steps.

    The loop, top to bottom: epochs x mini-batches (one optimizer step each), the gradient-SNR parts of a
    mini-batch (one part unless asked), its micro-batches (forward, loss, backward), then clip and step; what is
    measured goes to `UpdateDiagnostics`.
    """
    n_rows = batch.input_ids.shape[0]
    if ctx.enabled and grad_parts:
        raise ValueError("gradient SNR (grad_parts) needs the unsharded update")
    if advantages.shape != batch.loss_mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} vs loss mask {tuple(batch.loss_mask.shape)}")
    device = next(model.parameters()).device
    batch, advantages = batch.to(device), advantages.to(device)
    model.train()
    temperature = temperature if temperature > 0 else 1.0  # greedy sampling is scored at temperature 1
    rows = list(range(n_rows))
    splits = [rows[i::minibatches] for i in range(minibatches)] if minibatches > 1 else [rows]
    minibatch_rows = [split for _ in range(epochs) for split in splits if split]

    def has_signal(mb_rows: list[int]) -> bool:
        return bool((advantages[mb_rows] * batch.loss_mask[mb_rows]).any())

    # The first optimizer step that runs starts from exactly the weights the old log-probs are taken with, so its
    # own forward passes give the old log-probs of its rows (detached) and the no-grad pass scores only the other
    # rows: with one step, none (a third of the update's compute saved), with `minibatches` steps, a
    # 1/minibatches share of the pass. Sharded with several steps, the pass scores every row.
    first = next((r for r in minibatch_rows if not (skip_no_signal and not has_signal(r))), [])
    reuse_forward = set(first) if not ctx.enabled or len(minibatch_rows) == 1 else set()
    scored = [r for r in rows if r not in reuse_forward]
    old_logp = old_logprobs(model, batch, scored, temperature, micro_batch_tokens, forward, ctx)
    filling = bool(reuse_forward)  # the first step that runs fills its rows' old log-probs

    diagnostics = UpdateDiagnostics(stat_matrices or [], embed_head_matrices or [])
    for mb_rows in minibatch_rows:  # epochs x mini-batches: one optimizer step each
        signal = has_signal(mb_rows)
        diagnostics.without_signal += not signal
        if skip_no_signal and not signal:
            diagnostics.skipped += 1
            continue
        minibatch = slice_batch(batch, mb_rows)
        totals = {
            "tokens": float(minibatch.loss_mask.sum()),
            "nonempty_rows": float((minibatch.loss_mask.sum(1) > 0).sum()),
        }
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        in_step = set(mb_rows)
        parts = (
            [kept for part in grad_parts if (kept := [r for r in part if r in in_step])]
            if grad_parts and stat_matrices
            else [mb_rows]
        )
        for part in parts:  # the gradient-SNR parts, each back-propagated on its own (one part unless measured)
            if len(parts) > 1:
                diagnostics.snr.start_part()
            for micro_rows, weight in rank_micro_batches(batch, part, micro_batch_tokens, ctx):
                micro = slice_batch(batch, micro_rows)
                logp, entropy = token_logprobs(model, micro, temperature, with_entropy=True, forward=forward)
                if filling and weight:
                    old_logp[micro_rows, : micro.width] = logp.detach()
                token_loss, loss_metrics = policy_loss(
                    logp,
                    (old_logp[micro_rows, : micro.width] if not filling or weight else logp.detach()),
                    micro.rollout_logp if loss_cfg.tis_cap is not None else None,
                    advantages[micro_rows, : micro.width],
                    micro.loss_mask,
                    loss_cfg,
                    loss_scale_factor=float(minibatch.width) if loss_cfg.agg == "seq-mean-token-sum-norm" else None,
                )
                scaled = token_loss * (_agg_weight(loss_cfg.agg, micro, totals) * weight)
                # FSDP2 averages gradients over the ranks: N times each rank's share sums them
                (scaled * ctx.world_size if ctx.enabled else scaled).backward()
                step_loss += float(scaled.detach())
                n_tok = float(micro.loss_mask.sum()) * weight  # a stand-in adds its metric names, not its values
                loss_metrics["entropy"] = (entropy * micro.loss_mask).sum() / max(n_tok, 1.0)
                diagnostics.add_tokens(loss_metrics, n_tok)
            if len(parts) > 1:
                diagnostics.snr.end_part(_part_share(loss_cfg.agg, slice_batch(batch, part), totals))
        diagnostics.snr.end_step()
        params = [p for p in model.parameters() if p.grad is not None]
        grad_norm = _full(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else float("inf")))
        step_loss = ctx.all_sum([step_loss])[0]
        diagnostics.add_step(step_loss, float(grad_norm))
        filling = False
        if not (math.isfinite(step_loss) and math.isfinite(float(grad_norm))):
            diagnostics.skipped += 1
            optimizer.zero_grad(set_to_none=True)
            continue
        diagnostics.before_step()
        optimizer.step()
        diagnostics.after_step()
    if ctx.enabled and reuse_forward:  # each row was filled by one rank
        torch.distributed.all_reduce(old_logp)
    out = diagnostics.result(ctx)
    if return_old_logp:
        lengths = batch.attention_mask.sum(1).tolist()
        out["old_logp_rows"] = [old_logp[i, : n - 1].tolist() for i, n in enumerate(lengths)]
    return out


def old_logprobs(
    model: nn.Module,
    batch: PaddedBatch,
    rows: list[int],
    temperature: float,
    micro_batch_tokens: int,
    forward: ForwardSettings,
    ctx: DistContext,
) -> torch.Tensor:
    """The trainer's log-probs of `rows` before the update, micro-batched like the update itself (no gradients);
    the other rows stay 0 for the first optimizer step to fill."""
    old_logp = torch.zeros_like(batch.rollout_logp)
    if not rows:
        return old_logp
    with torch.no_grad():
        for micro_rows, weight in rank_micro_batches(batch, rows, micro_batch_tokens, ctx):
            micro = slice_batch(batch, micro_rows)
            logp = token_logprobs(model, micro, temperature, forward=forward)
            if weight:
                old_logp[micro_rows, : micro.width] = logp
    if ctx.enabled:  # each row was filled by one rank
        torch.distributed.all_reduce(old_logp)
    return old_logp


class UpdateDiagnostics:
    """What one update measures beside the step it takes: token-weighted loss metrics, the steps' losses and
    gradient norms, the step sizes on the hidden and the embedding/head matrices, the gradient SNR, and the counts
    of steps taken, skipped and without signal."""

    def __init__(self, stat_matrices: list[torch.Tensor], embed_head_matrices: list[torch.Tensor]):
        self.sums: dict[str, float] = {}
        self.weight_total = 0.0
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.skipped = self.steps = self.without_signal = 0
        self.step_sizes = {"update": StepSizes(stat_matrices), "embed_head_update": StepSizes(embed_head_matrices)}
        self.snr = GradientSNR(stat_matrices)

    def add_tokens(self, metrics: dict, n_tok: float) -> None:
        self.weight_total += n_tok
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * n_tok

    def add_step(self, loss: float, grad_norm: float) -> None:
        self.losses.append(loss)
        self.grad_norms.append(grad_norm)

    def before_step(self) -> None:
        for sizes in self.step_sizes.values():
            sizes.before_step()

    def after_step(self) -> None:
        self.steps += 1
        for sizes in self.step_sizes.values():
            sizes.after_step()

    def result(self, ctx: DistContext) -> dict:
        sums, weight_total = self.sums, self.weight_total
        if ctx.enabled:  # metrics were token-weighted on each rank's rows
            names = sorted(sums)
            totals_all = ctx.all_sum([sums[k] for k in names] + [weight_total])
            sums, weight_total = dict(zip(names, totals_all[:-1])), totals_all[-1]
        out: dict = {k: v / max(weight_total, 1.0) for k, v in sums.items()}
        # None (logged as null: not measured) where no step was computed, so a batch without signal is not
        # mistaken for a diverged one (NaN), which the collapse rule flags
        out.update(
            loss=sum(self.losses) / len(self.losses) if self.losses else None,
            grad_norm=sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else None,
            steps=self.steps,
            skipped_steps=self.skipped,
            no_signal_steps=self.without_signal,
        )
        for prefix, sizes in self.step_sizes.items():
            out[f"{prefix}_rms"], out[f"{prefix}_spectral_norm"] = sizes.result()
        if self.snr.values:
            out["grad_snr"] = sum(self.snr.values) / len(self.snr.values)
        return out


class GradientSNR:
    """The gradient SNR of each step whose mini-batch is back-propagated in parts: each part's gradient of the
    matrices (what it added, over its share of the loss), compared by `gradient_snr` when the step's parts are in."""

    def __init__(self, matrices: list[torch.Tensor]):
        self.matrices = matrices
        self.values: list[float] = []
        self._before: list[torch.Tensor] = []
        self._parts: list[torch.Tensor] = []

    def start_part(self) -> None:
        self._before = [m.grad.detach().clone() if m.grad is not None else torch.zeros_like(m) for m in self.matrices]

    def end_part(self, share: float) -> None:
        added = [(m.grad.detach() - b).flatten() for m, b in zip(self.matrices, self._before)]
        self._parts.append(torch.cat(added) / max(share, 1e-12))

    def end_step(self) -> None:
        if self._parts:
            self.values.append(gradient_snr(self._parts))
        self._parts = []


class StepSizes:
    """The size of the optimizer's steps on some matrices: the RMS over all their entries and steps, and the largest
    top singular value of one matrix's step (power iteration; matrices of one shape in one batched call). None
    where no step was measured."""

    def __init__(self, matrices: list[torch.Tensor]):
        self.matrices, self.before = matrices, []
        self.sq_sum, self.count, self.spec_max = 0.0, 0, 0.0

    def before_step(self) -> None:
        self.before = [_full(m.detach()).clone() for m in self.matrices]

    def after_step(self) -> None:
        by_shape: dict[tuple, list[torch.Tensor]] = {}
        for m, b in zip(self.matrices, self.before):
            d = (_full(m.detach()) - b).float()
            by_shape.setdefault(tuple(d.shape), []).append(d.reshape(d.shape[0], -1))
        for same in by_shape.values():
            rms, spec = matrix_update_stats(torch.stack(same))
            self.sq_sum += float(rms.pow(2).sum()) * same[0].numel()
            self.count += same[0].numel() * len(same)
            self.spec_max = max(self.spec_max, float(spec.max()))
        self.before = []

    def result(self) -> tuple[float | None, float | None]:
        if not self.count:
            return None, None
        return math.sqrt(self.sq_sum / self.count), self.spec_max


def gradient_snr(part_grads: list[torch.Tensor]) -> float:
    """Signal-to-noise ratio of the policy gradient from K >= 2 parts of a batch (one per episode), each an
    estimate g_k of the same expected gradient mu: ||mu||^2 / E||g_k - mu||^2, estimated without bias.

    The noise is s^2 = sum_k ||g_k - mean g||^2 / (K - 1). The squared norm of the mean overestimates ||mu||^2 by
    s^2 / K (in a space of many dimensions, K unrelated gradients give ||mean g||^2 = s^2 / K on their own), so the
    signal is ||mean g||^2 - s^2 / K: near 0, and possibly negative, when the parts agree no more than noise.
    NaN for K < 2 or an all-zero gradient (every advantage 0); inf when the parts agree exactly."""
    if len(part_grads) < 2:
        return float("nan")
    g = torch.stack([p.double() for p in part_grads])
    mean = g.mean(0)
    noise = float(((g - mean) ** 2).sum()) / (len(part_grads) - 1)
    signal = float((mean**2).sum()) - noise / len(part_grads)
    if noise > 0:
        return signal / noise
    return float("inf") if signal > 0 else float("nan")
