"""Advantage estimators as the trainer sees them: one object per run that turns each batch into per-token advantages
and keeps whatever it learns across batches.

The trainer's loop is the same for every estimator; all it knows of one is `Estimator`:

    informed = estimator.baseline_informed(trajs)         # logging: was each episode's baseline data-driven?
    adv, stats = estimator.advantages(trajs, batch)       # [B, T-1] on the batch's targets, and batch statistics
    estimator.before_update(episodes, score)              # may read the policy the update starts from
    out = policy_update(..., return_old_logp=estimator.needs_old_logp)
    estimator.after_update(episodes, trajs, out)          # may read what the update measured, or the new policy
    estimator.state_dict() / load_state_dict(state)       # checkpointed with the run

and, for the rollout driver, `sample_tasks` (which tasks the next batch plays; None: uniform) and
`dispatch_baseline` (what to snapshot on an episode when its task is handed out). `score` scores with the live
policy, so an estimator that keeps it and calls it in `after_update` reads the updated policy.

* `GroupEstimator` (GRPO, GiGPO, GraphGPO): stateless; every batch is judged on its own groups.
* `SPOEstimator` (SPO, SPO++): the per-task Beta tracker and everything that feeds it. The tracker gives the
  baselines, the prioritised task weights and the dispatch-time snapshots; after each update every trajectory's
  reward goes into it with a forgetting factor rho. With `rho_mode="kl_adaptive"` rho comes from how far the policy
  moved since the task's previous visit: the estimator keeps each task's last response with log-probs of it
  (`last_visit`) and, when a batch revisits the task, re-scores that response with the policy (`score`, one padded
  forward pass for the batch). D is the mean absolute difference of the two log-probs over the response's action
  tokens, and rho = clip(2^(-D / d_half), rho_min, rho_max) (`spo.logprob_divergence`, `BetaTracker.rho`).
  When (`rho_timing`): "after_update", SPO's verl recipe (`_get_spo_rho`, called after `update_actor`): after the
  update, the updated policy scores the previous responses and the batch's own, whose log-probs are kept for the
  next visit; "before_update": before the update, the policy it starts from scores the previous responses, and
  the update's old log-probs are kept. Both measure the shift over the updates between two visits; before_update's
  window ends one update earlier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from trainer.rl.advantages import compute_advantages
from trainer.rl.config import GROUP_ESTIMATORS, SPO_ESTIMATORS, RhoTiming, RLConfig, ShapingConfig
from trainer.rl.spo import (
    BetaTracker,
    logprob_divergence,
    read_offline_stats,
    spo_update_tracker,
    update_tracker_in_arrival_order,
)
from trainer.rl.trajectory import Trajectory

Score = Callable[[list[tuple[list[int], list[int]]]], torch.Tensor]
"""Log-probs of (tokens, loss mask) sequences under the current policy, [R, T-1] (see `update.score_sequences`)."""


class Estimator:
    """What the trainer calls; the defaults are those of an estimator without state."""

    needs_old_logp: bool = False
    """The update must return "old_logp_rows" (each episode's pre-update log-probs) for `after_update`."""
    tracker: BetaTracker | None = None
    """SPO's per-task Beta tracker; None for the group estimators."""

    def __init__(self, cfg: RLConfig, shaping: ShapingConfig):
        self.cfg = cfg
        self.shaping = shaping
        """The per-turn penalties' settings (the episode log's `overlong_turns` uses the same threshold)."""

    # -- rollouts ------------------------------------------------------------------------------------------
    sample_tasks: Callable[[list[str], int, torch.Generator], list[str]] | None = None
    """Draws the next batch's task ids (ids, k, generator); None: uniformly."""

    def dispatch_baseline(self, task_id: str) -> float | None:
        """Stored on an episode when its task is handed out (`Trajectory.baseline`); None: nothing to snapshot."""
        return None

    # -- one update ----------------------------------------------------------------------------------------
    def baseline_informed(self, trajectories: Sequence[Trajectory]) -> list[bool] | None:
        """Per trajectory, whether its baseline comes from data (read before this batch changes anything); None
        for an estimator without per-task baselines."""
        return None

    def advantages(self, trajectories: list[Trajectory], batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token advantages aligned with `batch`'s targets ([B, T-1], zero off the loss mask) and the batch
        statistics of `compute_advantages`."""
        tokens, stats = compute_advantages(trajectories, self.cfg, self.shaping, self.tracker, width=batch.width + 1)
        return tokens[:, 1:] * batch.loss_mask, stats

    def before_update(self, episodes: Sequence, score: Score) -> None:
        """Called after `advantages` and before the policy update, with the policy the update starts from."""

    def after_update(self, episodes: Sequence, trajectories: Sequence[Trajectory], update_output: dict) -> None:
        """Called after the policy update with its output (which holds "old_logp_rows" if `needs_old_logp`)."""

    # -- checkpoints ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got {sorted(state)}")


class GroupEstimator(Estimator):
    """GRPO, GiGPO, GraphGPO: each batch's groups are their own baseline; nothing carries over."""

    def __init__(self, cfg: RLConfig, shaping: ShapingConfig):
        if cfg.estimator not in GROUP_ESTIMATORS:
            raise ValueError(f"GroupEstimator serves {GROUP_ESTIMATORS}, got {cfg.estimator!r}")
        super().__init__(cfg, shaping)


class SPOEstimator(Estimator):
    """SPO and SPO++: the Beta tracker, its prioritised sampling and dispatch snapshots, and its updates."""

    def __init__(self, cfg: RLConfig, shaping: ShapingConfig, tracker: BetaTracker):
        """`tracker` is kept and updated (the rollout driver's sampler reads the same object); its settings (an
        `SPOConfig`, a cell's `rl.spo`) also say how it forgets and whether it picks the tasks."""
        if cfg.estimator not in SPO_ESTIMATORS:
            raise ValueError(f"SPOEstimator serves {SPO_ESTIMATORS}, got {cfg.estimator!r}")
        super().__init__(cfg, shaping)
        self.tracker = tracker
        self.kl_adaptive = tracker.cfg.rho_mode == "kl_adaptive"
        self.rho_timing: RhoTiming = tracker.cfg.rho_timing
        self.needs_old_logp = self.kl_adaptive and self.rho_timing == "before_update"
        if tracker.cfg.prioritised_sampling:
            self.sample_tasks = self._sample_tasks
        self.last_visit: dict[str, tuple[list[int], list[int], list[float]]] = {}
        """Per task, the previous visit's tokens, loss mask and trainer log-probs (KL-adaptive rho): post-update
        ones under "after_update", the update's old (pre-update) ones under "before_update"."""
        self._rhos: dict[str, float] = {}
        self._score: Score | None = None

    def _sample_tasks(self, task_ids: list[str], k: int, generator: torch.Generator) -> list[str]:
        return self.tracker.sample_tasks(task_ids, k, generator=generator)

    def dispatch_baseline(self, task_id: str) -> float:
        return self.tracker.baseline(task_id)

    def baseline_informed(self, trajectories: Sequence[Trajectory]) -> list[bool]:
        return [t.task_id in self.tracker for t in trajectories]

    def _forgetting(self, episodes: Sequence, score: Score, also: Sequence = ()) -> list[list[float]]:
        """Each batch task's rho into `self._rhos`: from the policy's shift since the task's previous visit
        (KL-adaptive; a first visit counts as D = 0), or the tracker's constant. The previous responses are scored
        in one `score` call together with the responses of `also`, whose log-prob rows are returned."""
        rhos, revisits = {}, []
        for e in episodes:
            prev = self.last_visit.get(e.task_id) if self.kl_adaptive else None
            if prev is None:
                rhos[e.task_id] = self.tracker.rho(None)
            else:
                revisits.append((e.task_id, prev))
        asked = [(tokens, mask) for _, (tokens, mask, _) in revisits] + [(e.tokens, e.loss_mask) for e in also]
        logp_now = score(asked) if asked else None
        for row, (task_id, (tokens, mask, logp_then)) in enumerate(revisits):
            n = len(tokens) - 1
            d = logprob_divergence(
                torch.tensor(logp_then), logp_now[row, :n], torch.tensor(mask[1:], dtype=torch.float32)
            )
            rhos[task_id] = self.tracker.rho(d)
        self._rhos = rhos
        return [logp_now[len(revisits) + i, : len(e.tokens) - 1].tolist() for i, e in enumerate(also)]

    def before_update(self, episodes: Sequence, score: Score) -> None:
        """Under "before_update" timing, each task's rho from the policy the update starts from; under
        "after_update", keep `score` for `after_update`."""
        if self.kl_adaptive and self.rho_timing == "after_update":
            self._score = score
        else:
            self._forgetting(episodes, score)

    def after_update(self, episodes: Sequence, trajectories: Sequence[Trajectory], update_output: dict) -> None:
        """Feed the batch's rewards to the tracker in arrival order, as each recipe does; remember each task's
        response and its log-probs for its next visit (post-update ones re-scored now, or the update's old ones)."""
        logp_rows: list[list[float]] = []
        if self.kl_adaptive and self.rho_timing == "after_update":
            if self._score is None:
                raise RuntimeError(
                    "SPOEstimator.after_update with rho_timing='after_update' needs the `score` "
                    "of this update's before_update; call before_update first"
                )
            logp_rows = self._forgetting(episodes, self._score, also=episodes)
        elif self.kl_adaptive:
            logp_rows = update_output["old_logp_rows"]
        rhos = self._rhos
        if self.cfg.estimator == "spo":
            spo_update_tracker(trajectories, self.tracker, [rhos[t.task_id] for t in trajectories])
        else:
            update_tracker_in_arrival_order(trajectories, self.tracker, lambda t: rhos[t.task_id])
        if self.kl_adaptive:
            for e, logp in zip(episodes, logp_rows):
                self.last_visit[e.task_id] = (list(e.tokens), list(e.loss_mask), logp)
        self._rhos, self._score = {}, None

    def state_dict(self) -> dict:
        return {"tracker": self.tracker.state_dict(), "last_visit": self.last_visit}

    def load_state_dict(self, state: dict) -> None:
        self.tracker.load_state_dict(state["tracker"])  # in place: the driver's sampler holds this tracker
        self.last_visit = state["last_visit"]


def make_estimator(rl: RLConfig, shaping: ShapingConfig) -> Estimator:
    """The estimator a cell's `rl` section asks for; SPO's tracker starts from `rl.spo.offline_stats` when given."""
    if rl.estimator in SPO_ESTIMATORS:
        stats = read_offline_stats(rl.spo.offline_stats) if rl.spo.offline_stats else {}
        return SPOEstimator(rl, shaping, BetaTracker.from_offline(stats, rl.spo))
    return GroupEstimator(rl, shaping)
