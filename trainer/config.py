"""The typed configuration of one training cell, loaded from YAML and checked before any work starts.

One dataclass per concern, each field with a docstring. `load_config` turns a nested mapping into these classes
and rejects an unknown key or a value of the wrong type with a message that names it (`rl.clip_hihg`), so a typo
in a 60-cell grid fails before the first cell runs, not after an hour. Recipes (the `RECIPES` table below) are named
presets over `optim` and `rl`; a cell may name a recipe and still override any field.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


@dataclass
class ModelConfig:
    preset: str | None = "minicpm-tiny"
    """A tiny architecture preset (trainer/policy/tiny.py) for the embedded scale; ignored when `path` is set."""
    path: str | None = None
    """A local directory with a Hugging Face checkpoint (paper scale) or a warm-started tiny model."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the trained model: its master weights. Keep float32 and set `run.compute_dtype` for bf16
    speed: bfloat16 weights keep 8 significant bits, so an update under half a bf16 step (0.2-0.4% of the weight; lr
    1e-6 on a weight of 0.01 is 0.01%) rounds away and the model does not move (the trainer warns)."""
    init_seed: int = 0
    """Seed of the random initialisation when building from a preset without `path`."""


@dataclass
class EnvConfig:
    name: Literal["minirepo", "textgame", "swe", "alfworld", "recall"] = "minirepo"
    """Environment family ("recall": the trivially learnable check of tests/test_learning_sanity.py)."""
    options: dict = field(default_factory=dict)
    """Fields of that family's own config dataclass (task seed, split sizes, difficulty, turn limit), validated
    by it; for example `{seed: 0, max_depth: 2}` for minirepo."""
    eval_tasks: int = 64
    """Held-out tasks played at each evaluation (the first N of the held-out split)."""
    probe_tasks: int = 0
    """The cheating probe (after ImpossibleBench): impossible variants of the first N held-out tasks, each with a
    hidden test that contradicts another, played at each evaluation beside the held-out tasks. No repository
    passes both tests, so any success means the grader was gamed: `cheat_rate` in the logs. 0: no probe; a family
    without impossible variants logs none."""
    train_tasks: int | None = None
    """The RL pool: the first N tasks of the training split (None: all of it). A warm start draws its
    demonstrations from the rest of the split, so the base policy never saw the solution of a task it is then
    trained on, and its starting training success is its held-out success (the band), not a memorised one."""


@dataclass
class OptimConfig:
    name: Literal["muon", "adam", "adam_high_lr"] = "muon"
    """"muon": Muon on hidden matrices + AdamW on the rest. "adam": AdamW on everything. "adam_high_lr": AdamW on
    everything at `muon_lr`, the companion paper's control (is Muon's gain only its larger step size?)."""
    lr: float = 1e-3
    """The cell's learning rate: AdamW's on every parameter under "adam"; under "muon", AdamW's on embeddings, head
    and norms and, unless `muon_lr` is set, Muon's on the hidden matrices, whose updates `adjust_lr_fn` scales to
    AdamW's RMS, so the same number means a step of the same size under both optimizers."""
    muon_lr: float | None = None
    """Muon's learning rate on the hidden matrices when it differs from `lr` (None: `lr`, Moonlight's rule); the
    AdamW learning rate of "adam_high_lr", which needs it."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    muon_weight_decay: float = 0.0
    """Muon decoupled weight decay (uses the unadjusted lr)."""
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = 0.95
    nesterov: bool = True
    ns_coefficients: str = "jordan"
    """"jordan" (torch's default) or "polar_express"."""
    adjust_lr_fn: Literal["original", "match_rms_adamw", "spectral"] = "match_rms_adamw"
    """How Muon scales its orthogonalised update by the matrix shape. "match_rms_adamw" (Moonlight): RMS 0.2 x lr,
    AdamW's typical update RMS, so one lr means the same step size under both optimizers: the project's rule at
    every scale. "original" (torch's default): lr x sqrt(max(1, rows/cols)), an RMS of about lr/sqrt(cols), which
    makes Muon's steps at a given lr several times smaller than AdamW's; "spectral": spectral norm lr x
    sqrt(rows/cols)."""
    grad_clip: float | None = 1.0
    """Clip the global norm of the raw gradients (never Muon's orthogonalised update); None: off."""


@dataclass
class RLConfig:
    estimator: Literal["spo", "spo++", "grpo", "gigpo", "graphgpo"] = "spo++"
    length_penalty: bool = True
    tool_penalty: bool = True
    length_threshold: int = 2048
    """Generated tokens a turn may use before the length penalty starts (scale it to the environment)."""
    length_ramp: int | None = None
    """Tokens over the threshold at which the penalty reaches -0.5; None: the threshold itself."""
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    tis_cap: float | None = 2.0
    """TIS cap C; None turns TIS off."""
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = "token-mean"
    group_size: int = 1
    """Rollouts per task: 1 for single-stream SPO; 8 for the companion's group estimators."""
    rho_mode: Literal["kl_adaptive", "constant"] = "kl_adaptive"
    """SPO tracker forgetting: KL-adaptive (recipe default) or constant."""
    spo_baseline: Literal["dispatch", "consume"] = "dispatch"
    """SPO++ baseline snapshot time."""
    spo_unit: Literal["turn", "token", "trajectory"] = "turn"
    """SPO++ standardisation unit."""
    prioritised_sampling: bool = True
    """SPO's task sampling with weights sqrt(p(1-p)) + 0.05; False: uniform."""
    gigpo_omega: float = 1.0
    gamma: float = 0.95
    graph_convention: Literal["reference", "paper"] = "reference"
    offline_stats: str | None = None
    """SPO's offline initialisation: a JSON file {task_id: [samples, successes]} from playing the training tasks
    with the base policy (the warm start writes `offline_stats.json` beside the policy); each task's Beta prior
    starts from it, as the recipe's offline pass does. None: every task starts at the uninformed prior 0.5."""


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    """hf: the batched KV-cached Hugging Face engine (CPU or GPU); vllm: vLLM on a GPU (needs model.path)."""
    vllm_gpu_memory_utilization: float = 0.5
    """Share of the GPU vLLM may take (the trainer's model shares the device)."""
    mode: Literal["sync", "lagged", "async"] = "lagged"
    """sync: rollouts by the current policy; lagged: always by the policy `lag` updates old (deterministic);
    async: a concurrent rollout thread, staleness bounded by `max_staleness`."""
    lag: int = 1
    max_staleness: int = 4
    batch_size: int = 16
    """Trajectories per update (tasks per update = batch_size / group_size)."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_turn_tokens: int = 48
    max_episode_tokens: int = 1024
    eval_temperature: float = 0.0
    """0: greedy evaluation."""


@dataclass
class RunConfig:
    updates: int = 100
    seed: int = 0
    minibatches: int = 1
    """PPO mini-batches: each pass over the update's trajectories takes this many optimizer steps (verl's
    train batch / ppo_mini_batch_size; its SPO recipe: 8). With 1 step per batch the PPO ratio is exactly 1 and
    the clip never binds."""
    epochs: int = 1
    """PPO epochs: passes over the update's trajectories (verl's ppo_epochs); `epochs x minibatches` optimizer
    steps per update, all against the log-probs taken before the first."""
    skip_no_signal: bool = True
    """Skip the optimizer step of a mini-batch whose advantages are all zero (an all-fail batch under plain SPO
    with equal baselines): its gradient is zero and only momentum would move the weights. Counted in the
    `skipped_steps` column."""
    micro_batch_tokens: int = 16384
    """Token budget of one forward/backward micro-batch (padded tokens); an episode longer than it is a micro-batch
    of its own, so 1 means one episode per micro-batch: no padding, which on CPU makes a tiny model's update
    about three times faster than padded micro-batches (the gradient is the same)."""
    eval_every: int = 10
    """Evaluate on held-out tasks every N updates (0: never); also after the first update (nearly the base
    policy, the point later evaluations are compared with) and after the last."""
    checkpoint_every: int = 25
    keep_checkpoints: int = 2
    threads: int = 1
    """torch intra-op threads. Grid cells run as parallel 1-thread jobs."""
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """Autocast dtype of the trainer's forward passes."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the trainer's model lives (paper scale: cuda)."""
    grad_snr: bool = False
    """Log `grad_snr`, the signal-to-noise ratio of the policy gradient estimated from per-episode gradients
    (trainer/update.py `gradient_snr`), for the companion study's diagnostics. Costs one backward pass per episode
    instead of one per micro-batch."""


@dataclass
class TrainConfig:
    recipe: str | None = None
    """A recipe name from `RECIPES`; its settings are applied first, explicit fields override them."""
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    run: RunConfig = field(default_factory=RunConfig)


@dataclass
class SFTConfig:
    """The supervised warm start that turns a random tiny model into the embedded study's base policy."""

    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Only the token limits, `temperature` and `top_p` are used: the band is measured by sampling as the RL
    rollouts sample, so it is the starting *training* success of the cells (what Figure 2 plots), not a greedy
    score that a temperature-1 policy would not reach."""
    noise: float = 0.3
    """Expert noise of the demonstrations: imperfect data gives an imperfect base policy, as in the papers."""
    n_demos: int = 1500
    """Expert episodes on training tasks."""
    vocab_size: int = 384
    """Byte-level BPE vocabulary trained on expert transcripts."""
    observation_loss_weight: float = 0.5
    """Weight of next-token loss on prompt and observation tokens (1 on actions). Learning the environment's
    language as well as the expert's actions makes a model trained from scratch learn to copy (file names, line
    numbers, code) much sooner; RL later trains the actions only."""
    optimizer: Literal["muon", "adamw"] = "muon"
    """Muon on the hidden matrices (AdamW on the rest) reached AdamW's 750-step loss in about 200 steps in our
    warm-start runs, so it is the default; this choice is independent of the RL cells' optimizer."""
    lr: float = 3e-3
    """AdamW learning rate (embeddings, norms and head under `muon`; every parameter under `adamw`)."""
    muon_lr: float = 0.02
    """Muon learning rate of the hidden matrices (used with `optimizer: muon`)."""
    batch_size: int = 16
    max_steps: int = 3000
    eval_every: int = 50
    eval_tasks: int = 64
    band: tuple[float, float] = (0.2, 0.35)
    """Stop at the first evaluation whose held-out success lies in [low, high]: the papers' starting points."""
    offline_samples: int = 0
    """SPO's offline pass: play every training task this many times with the chosen base policy (sampling as the
    rollouts do) and write the successes to `offline_stats.json` beside it, for `rl.offline_stats`. 0: none."""
    seed: int = 0
    threads: int = 1


RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "spo_adam": {"optim": {"name": "adam"}, "rl": dict(estimator="spo", length_penalty=False, tool_penalty=False,
                                                       agg="token-mean", tis_cap=None)},
    "spo_muon": {"optim": {"name": "muon"}, "rl": dict(estimator="spo", length_penalty=False, tool_penalty=False,
                                                       agg="token-mean", tis_cap=None)},
    "full": {"optim": {"name": "muon"}, "rl": dict(estimator="spo++", length_penalty=True, tool_penalty=True,
                                                   agg="token-mean", tis_cap=2.0)},
    "no_length": {"optim": {"name": "muon"}, "rl": dict(estimator="spo++", length_penalty=False, tool_penalty=True,
                                                        agg="token-mean", tis_cap=2.0)},
    "no_tool": {"optim": {"name": "muon"}, "rl": dict(estimator="spo++", length_penalty=True, tool_penalty=False,
                                                      agg="token-mean", tis_cap=2.0)},
    "no_penalties": {"optim": {"name": "muon"}, "rl": dict(estimator="spo++", length_penalty=False,
                                                           tool_penalty=False, agg="token-mean", tis_cap=2.0)},
    "no_length_seqmean": {"optim": {"name": "muon"}, "rl": dict(estimator="spo++", length_penalty=False,
                                                                tool_penalty=True, agg="seq-mean-token-mean",
                                                                tis_cap=2.0)},
    "no_length_seqmean_no_tis": {"optim": {"name": "muon"}, "rl": dict(estimator="spo++", length_penalty=False,
                                                                       tool_penalty=True, agg="seq-mean-token-mean",
                                                                       tis_cap=None)},
    **{estimator: {"optim": {"name": "adam"}, "rl": dict(estimator=estimator, length_penalty=False, tool_penalty=False,
                                                         agg="token-mean", tis_cap=None)}
       for estimator in ("grpo", "gigpo", "graphgpo")},
}
"""The paper's Figure-2 recipes, then the companion study's three group estimators (AdamW is its baseline; no
shaping penalties and no TIS, as in verl-agent's ALFWorld recipe). The optimizer is part of a recipe but any recipe
runs with any optimizer (the grid sets `optim.name` explicitly), as the paper's Adam versions of the ablations do."""
FIGURE2_RECIPES: tuple[str, ...] = ("spo_adam", "spo_muon", "full", "no_length", "no_tool", "no_penalties",
                                    "no_length_seqmean", "no_length_seqmean_no_tis")
"""The main paper's recipes in its Figure-2 order: the main study's tables and figures draw these."""



class ConfigError(ValueError):
    """A bad configuration: the message names the key and the value."""


def _check_value(tp, value, where: str):
    """Coerce `value` to annotation `tp` or raise ConfigError naming `where`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(arg, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {args}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_check_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    raise ConfigError(f"{where}: unsupported annotation {tp!r}")


def _build(cls, data, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise ConfigError(f"unknown config key {key!r} (known keys{' of ' + where if where else ''}: "
                          f"{sorted(names)})")
    kwargs = {k: _check_value(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def config_from_dict(data: dict) -> TrainConfig:
    """Build and validate a TrainConfig; a `recipe` name expands first, explicit keys override it."""
    data = dict(data or {})
    recipe = data.get("recipe")
    if recipe is not None:
        if recipe not in RECIPES:
            raise ConfigError(f"recipe: {recipe!r} is not one of {list(RECIPES)}")
        data = _merge(RECIPES[recipe], data)
    cfg = _build(TrainConfig, data, "")
    _check_ranges(cfg)
    return cfg


LIMITS: dict[str, int] = {"updates": 1_000_000, "epochs": 100, "episodes": 65_536, "tokens": 1_048_576,
                          "tasks": 1_000_000}
"""Upper bounds far above any study (the papers: 100-300 updates, 64-1024 episodes per update, 32k-token
episodes) and below what would only fail hours later or exhaust the machine (`batch_size: 10**9` allocates at run
time): a value above one is a typo, caught before the first cell."""
LIMITS_NOTE = "trainer.config.LIMITS: far above any study; a typo?"


def _check_ranges(cfg: TrainConfig) -> None:
    checks = [
        ("run.updates", cfg.run.updates >= 1), ("run.seed", cfg.run.seed >= 0),
        ("run.minibatches", cfg.run.minibatches >= 1), ("run.epochs", cfg.run.epochs >= 1),
        ("run.micro_batch_tokens", cfg.run.micro_batch_tokens >= 1),
        ("run.eval_every", cfg.run.eval_every >= 0), ("run.checkpoint_every", cfg.run.checkpoint_every >= 0),
        ("run.keep_checkpoints", cfg.run.keep_checkpoints >= 1), ("run.threads", cfg.run.threads >= 1),
        ("rollout.batch_size", cfg.rollout.batch_size >= 1), ("rollout.lag", cfg.rollout.lag >= 0),
        ("rollout.max_staleness", cfg.rollout.max_staleness >= 0),
        ("rollout.temperature", cfg.rollout.temperature >= 0), ("rollout.top_p", 0 < cfg.rollout.top_p <= 1),
        ("rollout.max_turn_tokens", cfg.rollout.max_turn_tokens >= 1),
        ("rollout.max_episode_tokens", cfg.rollout.max_episode_tokens >= 2),
        ("rl.group_size", cfg.rl.group_size >= 1),
        ("rl.clip_low", 0 <= cfg.rl.clip_low < 1), ("rl.clip_high", cfg.rl.clip_high >= 0),
        ("rl.tis_cap", cfg.rl.tis_cap is None or cfg.rl.tis_cap > 0),
        ("optim.lr", cfg.optim.lr >= 0), ("optim.muon_lr", cfg.optim.muon_lr is None or cfg.optim.muon_lr >= 0),
        ("optim.grad_clip", cfg.optim.grad_clip is None or cfg.optim.grad_clip > 0),
        ("env.eval_tasks", cfg.env.eval_tasks >= 0), ("env.probe_tasks", cfg.env.probe_tasks >= 0),
        ("env.train_tasks", cfg.env.train_tasks is None or cfg.env.train_tasks >= 1),
    ]
    for key, ok in checks:
        if not ok:
            section, name = key.split(".")
            raise ConfigError(f"{key}: bad value {getattr(getattr(cfg, section), name)!r}")
    for key, most in (("run.updates", LIMITS["updates"]), ("run.epochs", LIMITS["epochs"]),
                      ("rollout.batch_size", LIMITS["episodes"]), ("rollout.max_episode_tokens", LIMITS["tokens"]),
                      ("rollout.max_turn_tokens", LIMITS["tokens"]),
                      ("env.eval_tasks", LIMITS["tasks"]), ("env.probe_tasks", LIMITS["tasks"]),
                      ("env.train_tasks", LIMITS["tasks"] if cfg.env.train_tasks is not None else None)):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if most is not None and value > most:
            raise ConfigError(f"{key}: {value:,} is above {most:,} ({LIMITS_NOTE})")
    if cfg.optim.name == "adam_high_lr" and cfg.optim.muon_lr is None:
        raise ConfigError("optim.muon_lr: 'adam_high_lr' runs AdamW at Muon's learning rate; set optim.muon_lr")
    if cfg.run.minibatches > cfg.rollout.batch_size:
        raise ConfigError(f"run.minibatches {cfg.run.minibatches} exceeds rollout.batch_size "
                          f"{cfg.rollout.batch_size}: a mini-batch needs at least one trajectory")
    if cfg.rl.offline_stats is not None and not Path(cfg.rl.offline_stats).is_file():
        raise ConfigError(f"rl.offline_stats: {cfg.rl.offline_stats!r} is not a file")
    if cfg.rollout.batch_size % cfg.rl.group_size:
        raise ConfigError(f"rollout.batch_size {cfg.rollout.batch_size} is not a multiple of rl.group_size "
                          f"{cfg.rl.group_size}")
    if cfg.rl.estimator in ("grpo", "gigpo", "graphgpo") and cfg.rl.group_size < 2:
        raise ConfigError(f"rl.estimator {cfg.rl.estimator!r} needs rl.group_size >= 2, got {cfg.rl.group_size}")
    if cfg.model.path is not None and not Path(cfg.model.path).exists():
        raise ConfigError(f"model.path: {cfg.model.path!r} does not exist")
    if cfg.rollout.engine == "vllm" and cfg.model.path is None:
        raise ConfigError("rollout.engine: 'vllm' serves a checkpoint directory; set model.path")
    if cfg.model.path is None and cfg.model.preset is None:
        raise ConfigError("model: give a tiny `preset` or a checkpoint `path`")


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
    return config_from_dict(_merge(read_yaml_mapping(path), overrides or {}))


def load_sft_config(path: str | Path, overrides: dict | None = None) -> SFTConfig:
    """Read and validate a warm-start config."""
    cfg = _build(SFTConfig, _merge(read_yaml_mapping(path), overrides or {}), "")
    low, high = cfg.band
    if not 0 <= low <= high <= 1:
        raise ConfigError(f"band: need 0 <= low <= high <= 1, got {cfg.band}")
    for key in ("n_demos", "vocab_size", "batch_size", "max_steps", "eval_every", "threads"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{key}: must be >= 1, got {getattr(cfg, key)}")
    for key, most in (("n_demos", LIMITS["episodes"]), ("batch_size", LIMITS["episodes"]),
                      ("max_steps", LIMITS["updates"]), ("eval_tasks", LIMITS["tasks"])):
        if getattr(cfg, key) > most:
            raise ConfigError(f"{key}: {getattr(cfg, key)} is above {most:,} ({LIMITS_NOTE})")
    if cfg.offline_samples < 0:
        raise ConfigError(f"offline_samples: must be >= 0, got {cfg.offline_samples}")
    if not 0 <= cfg.noise <= 1:
        raise ConfigError(f"noise: must be in [0, 1], got {cfg.noise}")
    return cfg


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
