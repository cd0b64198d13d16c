"""The typed configuration of one training cell, loaded from YAML and checked before any work starts.

`TrainConfig` composes one section per concern, each field with its default, its allowed range (`knob`) and a
docstring: the one definition of every cell knob. The algorithm's sections (`rl`, `shaping`, `loss`) live beside
the algorithm in trainer/rl/config.py, `optim` in trainer/optim/config.py, `rollout` in trainer/rollout/config.py; this module holds the others and the
rules across sections (`TrainConfig.check_cell`: a whole cell's; a study's shared block is a partial cell, checked
by its sections only).
`load_config` turns a nested mapping into these classes and rejects an unknown key, a value of the wrong type or
out of range with a message that names it (`loss.clip_hihg`); the workflow checks a study's shared `cell` and
`warm_start` blocks with the same functions (trainer/study/), so a typo in a 60-cell grid fails before the
first cell runs, not after an hour. Recipes (trainer/recipes.py) are named presets over sections; a cell may name
a recipe and still override any field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from trainer.knobs import ConfigError, Section, build_config, knob, merge
from trainer.optim.config import OptimConfig, WarmStartOptimConfig
from trainer.recipes import RECIPES
from trainer.rl.config import LossConfig, RLConfig, ShapingConfig
from trainer.rollout.config import RolloutConfig


@dataclass
class ModelConfig(Section):
    preset: str | None = "minicpm-tiny"
    """A tiny architecture preset (trainer/policy/tiny.py) for the embedded scale; ignored when `path` is set."""
    path: str | None = None
    """A local directory with a Hugging Face checkpoint (paper scale) or a warm-started tiny model."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the trained model: its master weights. Keep float32 and set `run.compute_dtype` for bf16
    speed: bfloat16 weights keep 8 significant bits, so an update under half a bf16 step (0.2-0.4% of the weight; lr
    1e-6 on a weight of 0.01 is 0.01%) rounds away and the model does not move (the trainer warns)."""
    init_seed: int = knob(0, ge=0)
    """Seed of the random initialisation when building from a preset without `path`."""
    trust_remote_code: bool = False
    """Run the checkpoint's own modelling code (the `auto_map` of its config.json), as `from_pretrained(...,
    trust_remote_code=True)` does: what a family transformers does not ship needs (MiniCPM's dense models). Off
    unless the study says so: that code runs with the trainer's rights."""
    chat_template: str | None = None
    """The chat template the policy speaks: None keeps the checkpoint's own; a shipped name (`qwen3-stable`, in
    trainer/policy/templates/) or the path of a Jinja file. The rollout appends each turn's tokens to the
    conversation, so the template must be prefix-stable (Qwen3's own drops earlier turns' reasoning and is refused;
    `qwen3-stable` keeps it)."""
    template_options: dict = field(default_factory=dict)
    """Variables every rendering of the template gets, e.g. `{enable_thinking: false}` for Qwen3's non-thinking
    mode (the empty reasoning block in the generation prompt)."""


@dataclass
class EnvConfig(Section):
    name: Literal["minirepo", "textgame", "swe", "alfworld", "recall"] = "minirepo"
    """Environment family ("recall": the trivially learnable check of tests/integration/test_learning_sanity.py)."""
    options: dict = field(default_factory=dict)
    """Fields of that family's own config dataclass (task seed, split sizes, difficulty, turn limit), validated
    by it; for example `{seed: 0, max_depth: 2}` for minirepo."""
    eval_tasks: int = knob(64, ge=0, most="tasks")
    """Held-out tasks played at each evaluation (the first N of the held-out split)."""
    probe_tasks: int = knob(0, ge=0, most="tasks")
    """The cheating probe (after ImpossibleBench): impossible variants of the first N held-out tasks, each with a
    hidden test that contradicts another, played at each evaluation beside the held-out tasks. No repository
    passes both tests, so any success means the grader was gamed: `cheat_rate` in the logs. 0: no probe; a family
    without impossible variants logs none."""
    train_tasks: int | None = knob(None, ge=1, most="tasks")
    """The RL pool: the first N tasks of the training split (None: all of it). A warm start draws its
    demonstrations from the rest of the split, so the base policy never saw the solution of a task it is then
    trained on, and its starting training success is its held-out success (the band), not a memorised one."""


@dataclass
class RunConfig(Section):
    updates: int = knob(100, ge=1, most="updates")
    seed: int = knob(0, ge=0)
    minibatches: int = knob(1, ge=1)
    """PPO mini-batches: each pass over the update's trajectories takes this many optimizer steps (verl's
    train batch / ppo_mini_batch_size; its SPO recipe: 8). With 1 step per batch the PPO ratio is exactly 1 and
    the clip never binds."""
    epochs: int = knob(1, ge=1, most="epochs")
    """PPO epochs: passes over the update's trajectories (verl's ppo_epochs); `epochs x minibatches` optimizer
    steps per update, all against the log-probs taken before the first."""
    skip_no_signal: bool = True
    """Skip the optimizer step of a mini-batch whose advantages are all zero (an all-fail batch under plain SPO
    with equal baselines): its gradient is zero and only momentum would move the weights. Counted in the
    `skipped_steps` column; `no_signal_steps` counts such mini-batches whether skipped or not."""
    micro_batch_tokens: int = knob(16384, ge=1)
    """Token budget of one forward/backward micro-batch (padded tokens); an episode longer than it is a micro-batch
    of its own, so 1 means one episode per micro-batch: no padding, which on CPU makes a tiny model's update
    about three times faster than padded micro-batches (the gradient is the same)."""
    eval_every: int = knob(10, ge=0)
    """Evaluate on held-out tasks every N updates (0: never); also after the first update (nearly the base
    policy, the point later evaluations are compared with) and after the last."""
    transcript_episodes: int = knob(2, ge=0)
    """Episodes whose whole text (observations, actions, flags) is kept in `transcripts.parquet`: the first ones
    of every evaluation and of every `transcript_every`-th training batch (0: none). A few KB an episode here."""
    transcript_every: int = knob(10, ge=0)
    """Training updates between transcript samples (0: evaluations only)."""
    checkpoint_every: int = knob(25, ge=0)
    keep_checkpoints: int = knob(2, ge=1)
    checkpoint_format: Literal["full", "sharded"] = "full"
    """How checkpoints are written. "full": one file of whole state dicts, gathered to rank 0 (what one process
    holds anyway). "sharded": torch's DCP, every rank writing its own shards, no gather (a 4B model on 8 GPUs would
    gather ~48 GB on rank 0); it resumes on any number of processes, one included, and `python -m trainer export`
    turns it into a policy directory."""
    threads: int = knob(1, ge=1)
    """torch intra-op threads. Grid cells run as parallel 1-thread jobs."""
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """Autocast dtype of the trainer's forward passes."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the trainer's model lives (paper scale: cuda)."""
    grad_snr: bool = False
    """Log `grad_snr`, the signal-to-noise ratio of the policy gradient estimated from per-episode gradients
    (trainer/update.py `gradient_snr`), for the companion study's diagnostics. Costs one backward pass per episode
    instead of one per micro-batch. Needs the unsharded update (one process)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers'
    non-reentrant checkpointing): a long episode's update then holds one layer's activations, not all of them
    (`python -m trainer plan` shows the difference). Same gradients, about a third more compute."""
    logprob_chunk_tokens: int | None = knob(None, ge=1, most="tokens")
    """Compute the LM head's log-probs and entropy this many positions at a time, each chunk recomputed in the
    backward pass, so the [tokens x vocabulary] logits never exist whole (at 32k tokens and a 152k vocabulary
    they alone take ~100 GB). None: the whole micro-batch at once (the numbers differ from chunked ones only by
    rounding)."""
    require_flash_attention: bool = True
    """On CUDA, refuse when the trainer starts a model and compute dtype that the flash kernel cannot take
    (causal attention without a mask, as the update runs it), instead of falling back to the math kernel, whose
    T x T scores take ~69 GB per layer at 32k tokens. A check, not a kernel restriction: torch's restriction is
    process-wide and would bar the async rollout thread's masked attention too. Ignored on the CPU."""


@dataclass
class TrainConfig(Section):
    recipe: str | None = None
    """A recipe name from `RECIPES`; its settings are applied first, explicit fields override them."""
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def check_cell(self) -> None:
        """The rules across a whole cell's sections (each section checked its own fields when it was built), run by
        `config_from_dict`; not a `validate`, because a study's shared `cell` block is a TrainConfig too but only part
        of a cell (a GiGPO section beside the default estimator is legal there). ConfigError naming the key."""
        self.rl.check_sections()
        if self.run.minibatches > self.rollout.batch_size:
            raise ConfigError(
                f"run.minibatches {self.run.minibatches} exceeds rollout.batch_size "
                f"{self.rollout.batch_size}: a mini-batch needs at least one trajectory"
            )
        offline = self.rl.spo.offline_stats if self.rl.spo is not None else None
        if offline is not None and not Path(offline).is_file():
            raise ConfigError(f"rl.spo.offline_stats: {offline!r} is not a file")
        if self.rollout.batch_size % self.rl.group_size:
            raise ConfigError(
                f"rollout.batch_size {self.rollout.batch_size} is not a multiple of rl.group_size {self.rl.group_size}"
            )
        if self.model.path is not None and not Path(self.model.path).exists():
            raise ConfigError(f"model.path: {self.model.path!r} does not exist")
        if self.rollout.engine == "vllm" and self.model.path is None:
            raise ConfigError("rollout.engine: 'vllm' serves a checkpoint directory; set model.path")
        if self.rollout.server and self.rollout.engine == "hf":
            raise ConfigError(
                "rollout.server: the hf engine runs in the trainer; a rollout server runs the vllm or the reference engine"
            )
        if self.rollout.server_replicas > 1 and not (self.rollout.server and self.rollout.loop == "episodes"):
            raise ConfigError(
                f"rollout.server_replicas: {self.rollout.server_replicas} rollout servers need rollout.server: true "
                "and rollout.loop: episodes (the lock-step loop plays a batch on one engine)"
            )
        if self.rollout.loop == "episodes" and self.rollout.engine == "hf":
            raise ConfigError(
                "rollout.loop: 'episodes' needs an engine that serves one turn at a time (vllm or reference); the hf "
                "engine batches its decode step across episodes and plays loop: turns"
            )
        if self.model.path is None and self.model.preset is None:
            raise ConfigError("model: give a tiny `preset` or a checkpoint `path`")


@dataclass
class WarmStartConfig(Section):
    """The supervised warm start that turns a random tiny model into the embedded study's base policy."""

    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Only the token limits, `temperature` and `top_p` are used: the band is measured by sampling as the RL
    rollouts sample, so it is the starting *training* success of the cells (what Figure 2 plots), not a greedy
    score that a temperature-1 policy would not reach."""
    noise: float = knob(0.3, ge=0, le=1)
    """Expert noise of the demonstrations: imperfect data gives an imperfect base policy, as in the papers."""
    n_demos: int = knob(1500, ge=1, most="episodes")
    """Expert episodes on training tasks."""
    vocab_size: int = knob(384, ge=261)
    """Byte-level BPE vocabulary trained on expert transcripts."""
    observation_loss_weight: float = knob(0.5, ge=0)
    """Weight of next-token loss on prompt and observation tokens (1 on actions). Learning the environment's
    language as well as the expert's actions makes a model trained from scratch learn to copy (file names, line
    numbers, code) much sooner; RL later trains the actions only."""
    optim: WarmStartOptimConfig = field(default_factory=WarmStartOptimConfig)
    """The optimizer of the cloning steps and its learning rates by role (Muon on the hidden matrices by default),
    built by the cells' own builder; `grad_clip` clips the raw gradients as in a cell."""
    batch_size: int = knob(16, ge=1, most="episodes")
    max_steps: int = knob(3000, ge=1, most="updates")
    eval_every: int = knob(50, ge=1)
    eval_tasks: int = knob(64, ge=1, most="tasks")
    band: tuple[float, float] = knob((0.2, 0.35), ge=0, le=1)
    """Stop at the first evaluation whose held-out success lies in [low, high]: the papers' starting points."""
    offline_samples: int = knob(0, ge=0)
    """SPO's offline pass: play every training task this many times with the chosen base policy (sampling as the
    rollouts do) and write the successes to `offline_stats.json` beside it, for `rl.offline_stats`. 0: none."""
    seed: int = knob(0, ge=0)
    threads: int = knob(1, ge=1)

    def validate(self) -> None:
        super().validate()
        if self.band[0] > self.band[1]:
            raise ConfigError(f"band: low {self.band[0]} is above high {self.band[1]}")


OFFLINE_STATS_FILE = "offline_stats.json"
"""What the warm start writes beside the policy for `rl.spo.offline_stats` (WarmStartConfig.offline_samples > 0)."""


def config_from_dict(data: dict) -> TrainConfig:
    """Build and validate a TrainConfig; a `recipe` name expands first, explicit keys override it."""
    data = dict(data or {})
    recipe = data.get("recipe")
    if recipe is not None:
        if recipe not in RECIPES:
            raise ConfigError(f"recipe: {recipe!r} is not one of {list(RECIPES)}")
        data = merge(RECIPES[recipe], data)
    cfg = build_config(TrainConfig, data, "")
    cfg.check_cell()
    return cfg


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file's top-level mapping. ConfigError naming the file (and the line, for a syntax error) when it is
    missing, not UTF-8, not YAML, empty (a cell file truncated to nothing must not train the defaults) or not a
    mapping."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from None
    if data is None:
        raise ConfigError(f"config file {str(path)!r} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data


def load_config(path: str | Path, overrides: dict | None = None) -> TrainConfig:
    """Read a YAML cell config (plus optional overrides) and validate it."""
    return config_from_dict(merge(read_yaml_mapping(path), overrides or {}))


def load_warm_start_config(path: str | Path, overrides: dict | None = None) -> WarmStartConfig:
    """Read and validate a warm-start config."""
    return warm_start_config_from_dict(merge(read_yaml_mapping(path), overrides or {}))


def warm_start_config_from_dict(data: dict, where: str = "") -> WarmStartConfig:
    """Build and validate a WarmStartConfig (`where`: the prefix of the keys in messages, e.g. "warm_start")."""
    return build_config(WarmStartConfig, data, where)


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
