"""The config sections of the RL algorithm, each the one definition of its knobs: the loss (`loss:`), the per-turn
penalties (`shaping:`) and the advantage estimator (`rl:`), with one sub-section per estimator family.

`rl.estimator` chooses the estimator, and only that estimator's sections may be given (`ESTIMATOR_SECTIONS`): a
GiGPO cell carrying `rl.spo` is refused, not silently ignored. A chosen section left out takes its defaults.
Kept apart from the code that uses them (loss.py, shaping.py, spo.py, group_advantages.py) because those import
torch, and the workflow reads these sections to build a study's DAG without it.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from trainer.knobs import ConfigError, Section, knob

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = typing.get_args(Aggregation)


@dataclass
class LossConfig(Section):
    """The PPO clip-higher loss with truncated importance sampling (trainer/rl/loss.py)."""

    clip_low: float = knob(0.2, ge=0, lt=1)
    """The ratio's lower clip 1 - clip_low (for A < 0)."""
    clip_high: float = knob(0.28, ge=0)
    """The ratio's upper clip 1 + clip_high (for A > 0): DAPO's clip-higher, above clip_low."""
    dual_clip: float | None = knob(None, gt=1)
    """Dual-clip constant c > 1 bounding the loss of A < 0 tokens at -c * A; None: off."""
    tis_cap: float | None = knob(2.0, gt=0)
    """TIS cap C: each token's loss weighted by min(pi_old / pi_rollout, C); None turns TIS off."""
    agg: Aggregation = "token-mean"
    """How token losses become one number (verl's loss_agg_mode)."""


@dataclass
class ShapingConfig(Section):
    """The paper's per-turn length and tool-error penalties (trainer/rl/shaping.py). Defaults: the full recipe at
    paper scale."""

    length_penalty: bool = True
    """Penalise turns whose generated length exceeds `length_threshold`."""
    tool_penalty: bool = True
    """Penalise turns whose action was invalid (or failed to execute, see `count_exec_errors`)."""
    length_threshold: int = knob(2048, ge=0)
    """Generated tokens a turn may use before the length penalty starts (2048 at paper scale; scale it to the
    environment)."""
    length_ramp: int | None = knob(None, ge=0)
    """Tokens past the threshold at which the length penalty reaches its maximum; None: the threshold; 0: flat."""
    length_penalty_max: float = knob(0.5, ge=0)
    """Magnitude of the full length penalty (applied as a negative number)."""
    tool_error_penalty: float = knob(0.5, ge=0)
    """Magnitude of the tool-error penalty (applied as a negative number)."""
    clip: float = knob(0.25, ge=0)
    """The summed per-turn penalty is clipped to [-clip, +clip]."""
    exempt_last_turn: bool = True
    """The last turn of a trajectory never gets a length penalty."""
    count_exec_errors: bool = True
    """Execution errors count as tool errors, not only invalid actions."""

    @property
    def ramp(self) -> int:
        """The ramp in tokens, with None resolved to the threshold (resolved late, so `replace()` stays right)."""
        return self.length_threshold if self.length_ramp is None else self.length_ramp


RhoMode = Literal["kl_adaptive", "constant"]
RhoTiming = Literal["after_update", "before_update"]


@dataclass
class SPOConfig(Section):
    """SPO's per-task Beta tracker: its prior, its forgetting, its task sampling (trainer/rl/spo.py,
    trainer/rl/estimators.py). Defaults: the official recipe's."""

    prior_alpha: float = knob(0.5, gt=0)
    """alpha of a task with no offline samples and no visits (the recipe's offline_N = 0 case)."""
    prior_beta: float = knob(0.5, gt=0)
    """beta of such a task."""
    rho_mode: RhoMode = "kl_adaptive"
    """How the forgetting factor rho is picked. "kl_adaptive": from the policy shift D since the task's previous
    visit (the recipe's); "constant": always `rho_constant`."""
    rho_constant: float = knob(0.875, gt=0, le=1)
    """The forgetting factor in constant mode."""
    d_half: float = knob(0.06, gt=0)
    """D at which the adaptive rho would halve the old evidence (before clipping). Hard-coded in the recipe."""
    rho_min: float = knob(0.875, gt=0, lt=1)
    """Lower clip of the adaptive rho. Also sets the offline prior strength N_init = 1 / (1 - rho_min)."""
    rho_max: float = knob(0.96, gt=0, le=1)
    """Upper clip of the adaptive rho. Hard-coded in the recipe."""
    rho_timing: RhoTiming = "after_update"
    """When the KL-adaptive rho measures D. "after_update" (SPO's verl recipe): after the policy update, the
    previous response re-scored by the updated policy against the log-probs recorded right after that visit's
    update; costs one no-grad forward pass over the batch and the revisited responses per update.
    "before_update" (the harness's earlier reading, no reference's; kept to reproduce earlier runs): before the
    update, the current policy against the log-probs the previous visit's update started from: a shift over as
    many updates, one update earlier."""
    prioritised_sampling: bool = True
    """Task sampling with weights sqrt(p(1-p)) + `sampling_eps`; False: uniform."""
    sampling_eps: float = knob(0.05, ge=0)
    """Floor added to the sampling weight sqrt(p (1 - p)), so solved or hopeless tasks are still drawn."""
    offline_stats: str | None = None
    """SPO's offline initialisation: a JSON file {task_id: [samples, successes]} from playing the training tasks
    with the base policy (the warm start writes `offline_stats.json` beside the policy); each task's Beta prior
    starts from it, as the recipe's offline pass does. None: every task starts at the prior."""

    def validate(self) -> None:
        super().validate()
        if self.rho_min > self.rho_max:
            raise ConfigError(f"rho_min: {self.rho_min!r} is above rho_max {self.rho_max!r}")


@dataclass
class SPOPlusPlusConfig(Section):
    """The open choices of SPO++ (our reading of the paper; trainer/rl/spo.py)."""

    baseline: Literal["dispatch", "consume"] = "dispatch"
    """"dispatch": the tracker's baseline snapshotted when the rollout was handed out (`Trajectory.baseline`).
    "consume": read the tracker when the batch is consumed, as plain SPO does."""
    unit: Literal["turn", "token", "trajectory"] = "turn"
    """Standardisation multiset. "turn": one entry per turn over the whole batch. "token": each turn's entry
    counted once per generated token. "trajectory": standardise r - v with one entry per trajectory, then add the
    per-turn bonuses unstandardised."""
    eps: float = knob(1e-8, gt=0)
    """Added to the standard deviation before dividing."""


Mode = Literal["mean_norm", "mean_std_norm"]
MODES: tuple[str, ...] = typing.get_args(Mode)
StepPenalty = Literal["own_turn", "discounted"]
STEP_PENALTIES: tuple[str, ...] = typing.get_args(StepPenalty)
"""GiGPO's readings of the invalid-action penalty in the step returns (`GiGPOConfig.penalty`)."""
Convention = Literal["reference", "paper"]


@dataclass
class GRPOConfig(Section):
    """Episode-level group advantage (verl-agent's GRPO on multi-turn episodes; trainer/rl/group_advantages.py)."""

    success_reward: float = knob(10.0, ge=0)
    """Reward of a successful episode (ALFWorld: 10 * won). 0 turns success off."""
    invalid_penalty: float = knob(0.1, ge=0)
    """Subtracted once per turn whose action was invalid. 0 turns the penalty off."""
    mode: Mode = "mean_std_norm"
    """"mean_norm": R - mu; "mean_std_norm": (R - mu) / (sigma + eps), sigma the unbiased std."""
    eps: float = knob(1e-6, gt=0)
    """Added to sigma in mean_std_norm."""
    cross_steps: bool = True
    """True: group statistics count each trajectory once per turn (verl-agent's default); False: once."""


@dataclass
class GiGPOConfig(Section):
    """GiGPO: episode term plus omega times the anchor-state step term (trainer/rl/group_advantages.py)."""

    omega: float = 1.0
    """Weight of the step advantage (verl-agent's `step_advantage_w`)."""
    gamma: float = knob(0.95, ge=0, le=1)
    """Discount of the per-step returns R_k = sum_{j>=k} gamma^(j-k) r_j."""
    mode: Mode = "mean_norm"
    """Normalisation of both terms: "mean_norm" (x - mean; verl-agent's `core_gigpo.py` default) or
    "mean_std_norm" ((x - mean) / (std + eps); what verl-agent's ALFWorld script passes)."""
    eps: float = knob(1e-6, gt=0)
    """Added to sigma in mean_std_norm."""
    cross_steps: bool = True
    """Episode-term statistics count each trajectory once per turn (True, verl-agent) or once (False)."""
    success_reward: float = knob(10.0, ge=0)
    """Reward on the final turn of a successful episode. 0 turns success off."""
    invalid_penalty: float = knob(0.1, ge=0)
    """Subtracted on each turn whose action was invalid. 0 turns the penalty off."""
    penalty: StepPenalty = "own_turn"
    """How the invalid-action penalty enters the step returns: "own_turn" (verl-agent): G_k is the discounted
    environment return minus turn k's own penalty; "discounted": the penalty is a per-turn reward discounted into
    every earlier turn's return too."""


@dataclass
class GraphGPOConfig(Section):
    """GraphGPO: mean-std episode term plus the same-source-node graph term (trainer/rl/group_advantages.py)."""

    success_reward: float = knob(10.0, ge=0)
    """Reward of a successful episode, and R_s, the scale of the graph returns."""
    invalid_penalty: float = knob(0.1, ge=0)
    """Subtracted from the episode return once per invalid turn (the graph term ignores it)."""
    decay: float = knob(0.1, gt=0, le=1)
    """Base of the distance decay of graph returns (the paper's omega; renamed to avoid GiGPO's omega)."""
    edge_cost: float = knob(1.0, gt=0)
    """Cost of every edge occurrence in the shortest-path search."""
    convention: Convention = "reference"
    """"reference": G = R_s * decay**d(target); "paper" (Eq. 4): G = R_s * decay**(d(target) + edge_cost)."""
    beta_episode: float = 1.0
    """Weight of the episode advantage."""
    beta_graph: float = 1.0
    """Weight of the graph advantage."""
    eps: float = knob(1e-6, gt=0)
    """Added to every standard deviation."""
    cross_steps: bool = False
    """Episode statistics count each trajectory once (False, default) or once per turn (reference helper)."""


Estimator = Literal["spo", "spo++", "grpo", "gigpo", "graphgpo"]
ESTIMATORS: tuple[str, ...] = typing.get_args(Estimator)
SPO_ESTIMATORS: tuple[str, ...] = ("spo", "spo++")
"""Estimators with a per-task tracker (single-stream: one rollout per task is enough)."""
GROUP_ESTIMATORS: tuple[str, ...] = ("grpo", "gigpo", "graphgpo")
"""Estimators that compare the rollouts of one task with each other: they need rl.group_size >= 2."""
ESTIMATOR_SECTIONS: dict[str, tuple[str, ...]] = {
    "spo": ("spo",),
    "spo++": ("spo", "spo_plus_plus"),
    "grpo": ("grpo",),
    "gigpo": ("gigpo",),
    "graphgpo": ("graphgpo",),
}
"""The `rl` sub-sections each estimator reads; any other is refused in its cells."""
SECTION_CLASSES: dict[str, type[Section]] = {
    "spo": SPOConfig,
    "spo_plus_plus": SPOPlusPlusConfig,
    "grpo": GRPOConfig,
    "gigpo": GiGPOConfig,
    "graphgpo": GraphGPOConfig,
}
"""Each estimator section's class (`RLConfig`'s fields of those names)."""


@dataclass
class RLConfig(Section):
    """The advantage estimator: which one (`estimator`), its groups, and its own settings in its sections."""

    estimator: Estimator = "spo++"
    group_size: int = knob(1, ge=1)
    """Rollouts per task: 1 for single-stream SPO; 8 for the companion's group estimators."""
    spo: SPOConfig | None = None
    """SPO and SPO++'s tracker."""
    spo_plus_plus: SPOPlusPlusConfig | None = None
    """SPO++'s own choices."""
    grpo: GRPOConfig | None = None
    gigpo: GiGPOConfig | None = None
    graphgpo: GraphGPOConfig | None = None

    def __post_init__(self) -> None:
        """The chosen estimator's sections left out take their defaults (the others stay None)."""
        super().__post_init__()
        for name in ESTIMATOR_SECTIONS[self.estimator]:
            if getattr(self, name) is None:
                setattr(self, name, SECTION_CLASSES[name]())

    def check_sections(self, where: str = "rl") -> None:
        """ConfigError naming a section of an estimator this config does not use (a GiGPO cell's `rl.spo`)."""
        for name in SECTION_CLASSES:
            if getattr(self, name) is not None and name not in ESTIMATOR_SECTIONS[self.estimator]:
                raise ConfigError(
                    f"{where}.{name}: settings of another estimator; rl.estimator {self.estimator!r} reads "
                    f"{', '.join(f'{where}.{s}' for s in ESTIMATOR_SECTIONS[self.estimator])} only"
                )
        if self.estimator in GROUP_ESTIMATORS and self.group_size < 2:
            raise ConfigError(
                f"{where}.estimator {self.estimator!r} needs {where}.group_size >= 2, got {self.group_size}"
            )
