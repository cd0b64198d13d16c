"""SPO and SPO++: advantages for single-stream RL (one rollout per task, no groups).

SPO (Xu & Ding, arXiv:2509.13232; official verl recipe) replaces GRPO's group mean with a persistent
per-task Beta(alpha, beta) estimate of the success probability. This module has three parts:

1. `BetaTracker`: the per-task state, its offline initialisation, the forgetting factor rho, and the
   prioritised task sampler. Its state is plain Python floats and ints, so a checkpoint stores it exactly.
2. `spo_advantages` / `spo_update_tracker`: the recipe as published. A_i = r_i - v(x_i), with v read
   *before* any update from this batch. A is standardised over the batch, one entry per trajectory, and
   the same value goes to every turn. The tracker is updated in a separate call after the optimizer step, as
   the recipe does (`SPOEstimator.after_update` in estimators.py, which also keeps the KL-adaptive rho's state).
3. `spo_plus_plus_advantages` / `update_tracker_in_arrival_order`: SPO++, "stream-aligned" advantage
   estimation. No source text or code for SPO++ was found, so this is our reading of it. Every open
   choice is a field of `SPOPlusPlusConfig`.

Choices and why:

* **Rewards must lie in [0, 1].** Anything else raises. The recipe clamps negative scores to 0, but our
  rewards are binary, so a value outside [0, 1] means a bug upstream and should fail loudly.
* **A batch of one entry, or zero spread.** The unbiased std of one entry is undefined (torch gives NaN).
  We take sigma = 1 when there are fewer than two entries. After centring, a lone entry is 0, so a batch
  of one trajectory gets advantage 0. It gives no gradient; use `normalize=False` if that is not wanted.
  With zero spread, every centred value is 0 and the output is 0. `eps` must be > 0, so nothing here ever
  divides 0 by 0.
* **`turn_bonus` in plain SPO is added after standardisation.** So the SPO statistics stay exactly the
  recipe's: one entry per trajectory. The paper's SPO rows run with penalties off, so the default (None)
  is the recipe itself. To standardise penalties together with the outcome advantage, use SPO++ with
  `baseline="consume"`: it reads the baseline as SPO does, but puts the penalties inside the statistics
  (one entry per turn, not per trajectory).
* **Keyed by task id.** The recipe keys the tracker by the stripped text of the prompt's first message.
  We key it by `Trajectory.task_id`, which names the same thing without hashing prompts.
* **The SPO++ default is `baseline="dispatch"`, `unit="turn"`.**
  - "Dispatch": the rollout driver snapshots v(x) = `tracker.baseline(task_id)` when it hands the task out
    (`SPOEstimator.dispatch_baseline`, stored in `Trajectory.baseline`), and the advantage uses that
    snapshot. Under asynchronous training, other episodes of the same task may update the tracker while
    this one is running. The snapshot is the baseline that belongs to the policy version that produced the
    data, which is our reading of "stream-aligned".
  - "Turn": the paper adds a per-turn penalty to each turn's advantage, "then standardises across
    trajectories". The natural multiset for that is one entry per turn.
  - "Token" weighting would let a single very long turn dominate the statistics, the very length bias the
    paper's penalties fight. "Trajectory" would leave the penalties off the standardised scale.
  - Both alternatives stay available as switches.
* **Tracker updates in SPO++ happen one per finished trajectory, in arrival order.** The order of the
  list you pass is that order. rho may depend on the trajectory, for example on policy-version lag.
  Updates do not commute (rho discounts what came before), so the order is part of the algorithm.
* **A response with no scored tokens gives D = 0.** So does a first visit. Either way there is no
  evidence that the policy moved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict

import torch

from trainer.rl.config import SPOConfig, SPOPlusPlusConfig
from trainer.rl.trajectory import Trajectory

STATE_VERSION = 1


# ----------------------------------------------------------------------------------------------------------
# Forgetting factor and the policy-shift proxy D


def rho_from_divergence(
    divergence: float, d_half: float = 0.06, rho_min: float = 0.875, rho_max: float = 0.96
) -> float:
    """SPO's KL-adaptive forgetting factor: clip(2 ** (-D / d_half), rho_min, rho_max).

    The more the policy moved since the task's last visit (larger D), the faster old evidence is forgotten.
    """
    if not math.isfinite(divergence) or divergence < 0:
        raise ValueError(f"divergence must be a finite number >= 0, got {divergence!r}")
    if not d_half > 0:
        raise ValueError(f"d_half must be > 0, got {d_half!r}")
    if not 0 < rho_min <= rho_max <= 1:
        raise ValueError(f"need 0 < rho_min <= rho_max <= 1, got rho_min={rho_min!r}, rho_max={rho_max!r}")
    return min(max(2.0 ** (-divergence / d_half), rho_min), rho_max)


def logprob_divergence(logp_then: torch.Tensor, logp_now: torch.Tensor, mask: torch.Tensor) -> float:
    """D = masked token-mean of |logp_then - logp_now| over one stored response.

    `logp_then`: log-probs recorded for the response at the task's previous visit. `logp_now`: log-probs
    of the same tokens under the current policy. `mask`: 1 where a token counts, 0 elsewhere.
    All three have the same shape. Every element goes into one mean, so pass one response at a time.
    Masked-out positions may hold anything, even -inf padding. With no masked-in token, the result is 0.0.
    """
    if logp_then.shape != logp_now.shape or logp_then.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: logp_then {tuple(logp_then.shape)}, logp_now {tuple(logp_now.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    keep = mask.to(torch.float64)
    if not bool(((keep == 0) | (keep == 1)).all()):
        raise ValueError("mask must contain only 0 and 1")
    keep = keep.bool()
    n = int(keep.sum())
    if n == 0:
        return 0.0
    diff = (logp_then.to(torch.float64) - logp_now.to(torch.float64))[keep]
    if not bool(torch.isfinite(diff).all()):
        raise ValueError("logp_then - logp_now is not finite on a masked-in token")
    return float(diff.abs().sum() / n)


# ----------------------------------------------------------------------------------------------------------
# The offline pass's statistics (the recipe plays each training prompt n0 times with the base policy)


def write_offline_stats(path, stats: Mapping[str, tuple[int, int]]) -> None:
    """Write {task_id: [samples, successes]} as JSON, atomically."""
    import json

    from trainer.atomic import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({k: [int(n), int(s)] for k, (n, s) in sorted(stats.items())}, indent=0))


def read_offline_stats(path) -> dict[str, tuple[int, int]]:
    """{task_id: (samples, successes)} from `write_offline_stats`'s file; a malformed file raises ValueError
    naming it."""
    import json
    from pathlib import Path

    try:
        raw = json.loads(Path(path).read_text())
        stats = {str(k): (int(v[0]), int(v[1])) for k, v in raw.items()}
    except (OSError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(
            f"offline stats {str(path)!r}: expected a JSON object {{task_id: [samples, successes]}} ({e})"
        ) from None
    bad = [k for k, (n, s) in stats.items() if not 0 <= s <= n]
    if bad:
        raise ValueError(f"offline stats {str(path)!r}: task {bad[0]!r} has successes outside [0, samples]")
    return stats


# ----------------------------------------------------------------------------------------------------------
# The per-task Beta tracker


def _check_task_id(task_id: str) -> None:
    # Only str keys: an int key would come back as a str after a JSON round trip of the checkpoint.
    if not isinstance(task_id, str):
        raise TypeError(f"task_id must be a str, got {type(task_id).__name__} {task_id!r}")


def _check_reward(reward: float, where: str) -> float:
    reward = float(reward)
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise ValueError(f"{where}: reward must be in [0, 1], got {reward!r}")
    return reward


class BetaTracker:
    """Per-task Beta(alpha, beta) estimate of the success probability, keyed by task id.

    The baseline is v(x) = alpha / (alpha + beta). Tasks never seen start at the configured prior.
    """

    def __init__(self, cfg: SPOConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else SPOConfig()
        self._alpha: dict[str, float] = {}
        self._beta: dict[str, float] = {}
        self._visits: dict[str, int] = {}

    # -- initialisation ------------------------------------------------------------------------------------
    @classmethod
    def from_offline(cls, stats: Mapping[str, tuple[int, int]], cfg: SPOConfig | None = None) -> BetaTracker:
        """A tracker initialised from offline samples: `stats[task_id] = (n_samples, n_successes)`."""
        tracker = cls(cfg)
        for task_id, (n_samples, n_successes) in stats.items():
            tracker.init_task(task_id, n_samples, n_successes)
        return tracker

    def init_task(self, task_id: str, n_samples: int, n_successes: int) -> None:
        """Set a task's prior from n0 offline samples with s successes (the recipe's formula).

        N_init = 1/(1 - rho_min). alpha0 = N_init (s + 0.5)/(n0 + 1), beta0 = N_init (n0 - s + 0.5)/(n0 + 1).
        So alpha0 + beta0 = N_init, which is the steady-state effective count of the update rule.
        With n0 = 0, the task starts at the configured prior.
        """
        _check_task_id(task_id)
        if (
            isinstance(n_samples, bool)
            or isinstance(n_successes, bool)
            or not (isinstance(n_samples, int) and isinstance(n_successes, int))
        ):
            raise TypeError(
                f"task {task_id!r}: n_samples and n_successes must be ints, got {n_samples!r}, {n_successes!r}"
            )
        if not 0 <= n_successes <= n_samples:
            raise ValueError(
                f"task {task_id!r}: need 0 <= n_successes <= n_samples, "
                f"got n_successes={n_successes}, n_samples={n_samples}"
            )
        if n_samples == 0:
            alpha, beta = self.cfg.prior_alpha, self.cfg.prior_beta
        else:
            n_init = 1.0 / (1.0 - self.cfg.rho_min)
            alpha = n_init * (n_successes + 0.5) / (n_samples + 1)
            beta = n_init * (n_samples - n_successes + 0.5) / (n_samples + 1)
        self._alpha[task_id], self._beta[task_id] = alpha, beta
        self._visits.setdefault(task_id, 0)

    # -- reading -------------------------------------------------------------------------------------------
    def alpha_beta(self, task_id: str) -> tuple[float, float]:
        """(alpha, beta) of a task; the prior for a task never initialised or visited."""
        _check_task_id(task_id)
        return (self._alpha.get(task_id, self.cfg.prior_alpha), self._beta.get(task_id, self.cfg.prior_beta))

    def baseline(self, task_id: str) -> float:
        """v(x) = alpha / (alpha + beta). Reading it never changes the tracker."""
        alpha, beta = self.alpha_beta(task_id)
        return alpha / (alpha + beta)

    def visits(self, task_id: str) -> int:
        """How many updates the task has had (0 means the next update is a first visit, so D = 0)."""
        _check_task_id(task_id)
        return self._visits.get(task_id, 0)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._alpha

    def __len__(self) -> int:
        return len(self._alpha)

    # -- forgetting and update -----------------------------------------------------------------------------
    def rho(self, divergence: float | None = None) -> float:
        """The forgetting factor for one update, chosen by `cfg.rho_mode`. None (a first visit) means D = 0."""
        if self.cfg.rho_mode == "constant":
            return self.cfg.rho_constant
        return rho_from_divergence(
            0.0 if divergence is None else divergence, self.cfg.d_half, self.cfg.rho_min, self.cfg.rho_max
        )

    def update(self, task_id: str, reward: float, rho: float) -> None:
        """alpha <- rho alpha + r, beta <- rho beta + (1 - r). r must be in [0, 1]; rho in (0, 1]."""
        _check_task_id(task_id)
        reward = _check_reward(reward, f"task {task_id!r}")
        rho = float(rho)
        if not 0 < rho <= 1:
            raise ValueError(f"task {task_id!r}: rho must be in (0, 1], got {rho!r}")
        alpha, beta = self.alpha_beta(task_id)
        self._alpha[task_id] = rho * alpha + reward
        self._beta[task_id] = rho * beta + (1.0 - reward)
        self._visits[task_id] = self._visits.get(task_id, 0) + 1

    # -- prioritised sampling ------------------------------------------------------------------------------
    def sampling_weights(self, task_ids: Sequence[str]) -> torch.Tensor:
        """w(x) = sqrt(p (1 - p)) + sampling_eps with p = v(x); float64, one weight per id."""
        p = torch.tensor([self.baseline(t) for t in task_ids], dtype=torch.float64)
        return torch.sqrt(p * (1.0 - p)) + self.cfg.sampling_eps

    def sample_tasks(
        self,
        task_ids: Sequence[str],
        k: int,
        generator: torch.Generator | None = None,
    ) -> list[str]:
        """Draw k task ids with P proportional to `sampling_weights`.

        Draws are without replacement when k <= len(task_ids), with replacement otherwise (as in the recipe).
        Pass a seeded torch.Generator for a deterministic draw.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        if len(set(task_ids)) != len(task_ids):
            raise ValueError("task_ids contains duplicates; pass each candidate task once")
        if k == 0:
            return []
        if len(task_ids) == 0:
            raise ValueError(f"cannot sample k={k} tasks from an empty pool")
        weights = self.sampling_weights(task_ids)
        if not bool(weights.sum() > 0):
            raise ValueError("all sampling weights are 0 (sampling_eps = 0 and every task has p in {0, 1})")
        index = torch.multinomial(weights, k, replacement=k > len(task_ids), generator=generator)
        return [task_ids[i] for i in index.tolist()]

    # -- checkpointing -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Config and per-task state as plain dicts, floats and ints (JSON- and torch.save-safe)."""
        return {
            "version": STATE_VERSION,
            "config": asdict(self.cfg),
            "tasks": {
                t: {"alpha": self._alpha[t], "beta": self._beta[t], "visits": self._visits.get(t, 0)}
                for t in self._alpha
            },
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Replace config and state with those of `state_dict()` (the optimizer convention: config included)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"unsupported BetaTracker state version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        cfg = SPOConfig(**state["config"])
        alpha, beta, visits = {}, {}, {}
        for task_id, entry in state["tasks"].items():
            _check_task_id(task_id)
            a, b, n = float(entry["alpha"]), float(entry["beta"]), int(entry["visits"])
            if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0 and a + b > 0 and n >= 0):
                raise ValueError(f"task {task_id!r}: bad tracker state alpha={a!r}, beta={b!r}, visits={n!r}")
            alpha[task_id], beta[task_id], visits[task_id] = a, b, n
        self.cfg, self._alpha, self._beta, self._visits = cfg, alpha, beta, visits


# ----------------------------------------------------------------------------------------------------------
# Shared checks and the standardisation


def _check_batch(trajectories: Sequence[Trajectory]) -> None:
    if len(trajectories) == 0:
        raise ValueError("empty batch: advantages need at least one trajectory")
    for i, traj in enumerate(trajectories):
        if len(traj.turns) == 0:
            raise ValueError(
                f"trajectory {i} (task {traj.task_id!r}) has zero turns; "
                "advantages are per turn, so every trajectory needs at least one"
            )
        _check_reward(traj.reward, f"trajectory {i} (task {traj.task_id!r})")


def _bonus_rows(
    trajectories: Sequence[Trajectory],
    turn_bonus: Sequence[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """Per-turn bonuses as float64 rows (zeros when None), checked against the turn counts."""
    if turn_bonus is None:
        return [torch.zeros(len(t.turns), dtype=torch.float64) for t in trajectories]
    if len(turn_bonus) != len(trajectories):
        raise ValueError(f"turn_bonus has {len(turn_bonus)} rows for {len(trajectories)} trajectories")
    rows = []
    for i, (traj, bonus) in enumerate(zip(trajectories, turn_bonus)):
        bonus = torch.as_tensor(bonus, dtype=torch.float64)
        if bonus.dim() != 1 or bonus.numel() != len(traj.turns):
            raise ValueError(
                f"turn_bonus[{i}] (task {traj.task_id!r}) has shape {tuple(bonus.shape)}, "
                f"expected ({len(traj.turns)},): one value per turn"
            )
        if not bool(torch.isfinite(bonus).all()):
            raise ValueError(f"turn_bonus[{i}] (task {traj.task_id!r}) is not finite: {bonus.tolist()}")
        rows.append(bonus)
    return rows


def _check_eps(eps: float) -> None:
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")


def _standardise(values: torch.Tensor, eps: float, counts: torch.Tensor | None = None) -> torch.Tensor:
    """(v - mean) / (std + eps), with unbiased statistics over a multiset.

    `counts[j]` says how many times `values[j]` occurs (token weighting). None means once each, and then
    this is exactly torch.mean / torch.std. With fewer than two entries, std is taken as 1.
    """
    counts = torch.ones_like(values) if counts is None else counts.to(values.dtype)
    n = counts.sum()
    if not bool(n > 0):
        raise ValueError("nothing to standardise: the multiset has no entries (all counts are 0)")
    mean = (counts * values).sum() / n
    centred = values - mean
    if bool(n < 2):
        std = torch.ones((), dtype=values.dtype)
    else:
        std = torch.sqrt((counts * centred**2).sum() / (n - 1))
    return centred / (std + eps)


@contextmanager
def _all_or_nothing(tracker: BetaTracker) -> Iterator[None]:
    """Restore the tracker if a batch of updates fails halfway (a bad reward or rho), so no half-batch sticks."""
    saved = tracker.state_dict()
    try:
        yield
    except BaseException:
        tracker.load_state_dict(saved)
        raise


# ----------------------------------------------------------------------------------------------------------
# SPO (the published recipe)


def spo_advantages(
    trajectories: Sequence[Trajectory],
    tracker: BetaTracker,
    *,
    normalize: bool = True,
    eps: float = 1e-8,
    turn_bonus: Sequence[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """SPO advantages, one fp32 value per turn for each trajectory.

    A_i = r_i - v(x_i), with v read from the tracker as it is now. This function never updates the
    tracker, so every baseline is read before this batch's updates. If a task appears twice, both episodes
    see the same v. With `normalize`, A is standardised over the batch, one entry per trajectory
    (unbiased std, as torch.std). A is then broadcast to every turn. `turn_bonus`, if given, is added per
    turn after standardisation.
    """
    _check_batch(trajectories)
    _check_eps(eps)
    bonus = _bonus_rows(trajectories, turn_bonus)
    base = torch.tensor([float(t.reward) - tracker.baseline(t.task_id) for t in trajectories], dtype=torch.float64)
    if normalize:
        base = _standardise(base, eps)
    return [(a + c).to(torch.float32) for a, c in zip(base, bonus)]


def spo_update_tracker(trajectories: Sequence[Trajectory], tracker: BetaTracker, rhos: float | Sequence[float]) -> None:
    """Feed each trajectory's reward to the tracker in list order. `rhos` is one value for all, or one per
    trajectory. Call this after the optimizer step, as the recipe does. If any update fails (a bad reward or
    rho), the tracker is left as it was."""
    if isinstance(rhos, torch.Tensor):
        rhos = rhos.tolist()
    if isinstance(rhos, (int, float)):
        rhos = [float(rhos)] * len(trajectories)
    if len(rhos) != len(trajectories):
        raise ValueError(f"rhos has {len(rhos)} values for {len(trajectories)} trajectories")
    with _all_or_nothing(tracker):
        for traj, rho in zip(trajectories, rhos):
            tracker.update(traj.task_id, traj.reward, rho)


# ----------------------------------------------------------------------------------------------------------
# SPO++ (stream-aligned; our reading, every open choice a switch)


def _baselines(trajectories: Sequence[Trajectory], tracker: BetaTracker | None, source: str) -> list[float]:
    if source == "consume":
        if tracker is None:
            raise ValueError("SPOPlusPlusConfig.baseline='consume' needs a tracker, got None")
        return [tracker.baseline(t.task_id) for t in trajectories]
    values = []
    for i, traj in enumerate(trajectories):
        if traj.baseline is None:
            raise ValueError(
                f"trajectory {i} (task {traj.task_id!r}) has no dispatch-time baseline "
                "(Trajectory.baseline is None); store tracker.baseline(task_id) on it when "
                "dispatching, or use baseline='consume'"
            )
        value = float(traj.baseline)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"trajectory {i} (task {traj.task_id!r}): baseline must be in [0, 1], got {value!r}")
        values.append(value)
    return values


def spo_plus_plus_advantages(
    trajectories: Sequence[Trajectory],
    tracker: BetaTracker | None,
    turn_bonus: Sequence[torch.Tensor] | None,
    cfg: SPOPlusPlusConfig | None = None,
) -> list[torch.Tensor]:
    """SPO++ advantages, one fp32 value per turn for each trajectory.

    a(tau) = r - v(x), with v from the dispatch snapshot or the tracker (`cfg.baseline`). The turn
    advantage is a_k = a(tau) + c_k, where c_k = turn_bonus (None: no penalties). It is then standardised
    over the batch multiset chosen by `cfg.unit`. The tracker is only read, and only in "consume" mode.
    """
    cfg = cfg if cfg is not None else SPOPlusPlusConfig()
    _check_batch(trajectories)
    bonus = _bonus_rows(trajectories, turn_bonus)
    base = torch.tensor(
        [float(t.reward) - v for t, v in zip(trajectories, _baselines(trajectories, tracker, cfg.baseline))],
        dtype=torch.float64,
    )
    if cfg.unit == "trajectory":
        base = _standardise(base, cfg.eps)
        return [(a + c).to(torch.float32) for a, c in zip(base, bonus)]

    per_turn = [a + c for a, c in zip(base, bonus)]
    flat = torch.cat(per_turn)
    counts = None
    if cfg.unit == "token":
        counts = torch.tensor([turn.length for t in trajectories for turn in t.turns], dtype=torch.float64)
        if bool((counts < 0).any()):
            raise ValueError("a turn has end < start (negative length)")
        if not bool(counts.sum() > 0):
            raise ValueError("unit='token' but the batch has no generated tokens (every turn has length 0)")
    flat = _standardise(flat, cfg.eps, counts)
    return [row.to(torch.float32) for row in torch.split(flat, [len(t.turns) for t in trajectories])]


def update_tracker_in_arrival_order(
    trajectories: Sequence[Trajectory], tracker: BetaTracker, rho_fn: Callable[[Trajectory], float]
) -> list[float]:
    """One tracker update per finished trajectory, in list order (which must be arrival order).

    `rho_fn(traj)` gives that update's forgetting factor, for example from the trajectory's policy-version
    lag, or `lambda t: tracker.rho(d[t.task_id])`. It is called once per trajectory, in order, after the
    previous update, so it may read the tracker (e.g. `tracker.visits`). Returns the rhos used, for logging.
    If any update fails, the tracker is left as it was.
    """
    used = []
    with _all_or_nothing(tracker):
        for traj in trajectories:
            rho = float(rho_fn(traj))
            tracker.update(traj.task_id, traj.reward, rho)
            used.append(rho)
    return used
