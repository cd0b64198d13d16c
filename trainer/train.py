"""The program each grid cell runs: rollouts -> advantages -> policy update -> logs, `run.updates` times.

`Trainer.__init__` builds everything from the config, `run` resumes from the newest checkpoint if asked and loops
over `train_step`, evaluating every `run.eval_every` updates. The loop knows the advantage estimator only through
`trainer.rl.estimators.Estimator` (advantages, hooks before and after the update, checkpoint state), and writes its
logs through `trainer.logs.rows`.

Every source of randomness is an explicit generator (task sampling, token sampling, evaluation) or a seeded global
that is checkpointed, so the deterministic modes (`sync`, `lagged`) rerun bit for bit, also across a SIGKILL and
`--resume`. Timing columns (rollout_s, train_s, wall_s) are the only ones that differ between such runs.

Under `torchrun` (several processes) the update is sharded with FSDP2 (`trainer/distributed.py`): rank 0 plays the
rollouts and evaluations with an unsharded copy of the weights gathered after each update, broadcasts the
episodes, writes the logs and the final policy; every rank computes the same advantages. Checkpoints are full state
dicts gathered to rank 0 or, with `run.checkpoint_format: sharded`, DCP shards each rank writes (no gather); either
resumes on any number of processes and exports to a one-process policy (`python -m trainer export`).
"""

from __future__ import annotations

import copy
import functools
import random
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from trainer.atomic import atomic_path
from trainer.checkpoints import (
    capture_rng_state,
    list_checkpoints,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from trainer.config import ConfigError, TrainConfig, config_from_dict, config_to_dict
from trainer.distributed import (
    enable_activation_checkpointing,
    full_optimizer_state,
    full_weights,
    init_distributed,
    load_full_state,
    rank_device,
    shard_model,
)
from trainer.environments.suite import make_suite
from trainer.logs.parquet_log import EPISODE_COLUMNS, METRIC_COLUMNS, MetricsLog
from trainer.logs.provenance import collect_provenance
from trainer.logs.rows import episode_row, update_row
from trainer.logs.transcripts import TRANSCRIPT_COLUMNS, TRANSCRIPTS_FILE, transcript_rows
from trainer.optim.build import build_optimizer
from trainer.optim.hybrid import route_parameters
from trainer.policy.load import DTYPES, load_policy, new_tiny_policy, policy_options, save_policy
from trainer.rl.estimators import make_estimator
from trainer.rollout.driver import RolloutDriver, TaskSampler
from trainer.rollout.evaluation import eval_generator, evaluate
from trainer.rollout.hf_engine import HFEngine
from trainer.rollout.sampling import SamplingParams
from trainer.update import (
    ForwardSettings,
    check_flash_attention,
    pad_episodes,
    policy_update,
    score_sequences,
)

METRICS_FILE, EPISODES_FILE, CHECKPOINT_DIR = "metrics.parquet", "episodes.parquet", "checkpoints"
RESOLVED_CONFIG_FILE = "config.resolved.yaml"
"""The cell's whole config as it runs (every default, the recipe expanded), written at start beside the sparse
cell.yaml the workflow writes: what `python -m trainer train --config` reads back as the same config."""
STATE_FORMAT = "trainer.state/2"
"""The layout of `Trainer.state_dict()`; a checkpoint with another (or none) is refused at resume."""
LIVE_FLUSH_S = 10.0
"""The Parquet logs are rewritten at most this often between checkpoints, so a running cell can be read (a
rewrite is atomic and costs milliseconds; what a resume later drops is rewritten at its next flush)."""


def build_policy(cfg: TrainConfig, suite, device: str | None = None):
    """(model, chat format) a cell starts from: `model.path`, or a fresh tiny model whose tokenizer is trained on
    the suite's texts (deterministic in `model.init_seed`), in `model.dtype` on `device` (default `run.device`)."""
    if cfg.model.path is not None:
        model, fmt = load_policy(cfg.model.path, cfg.model.dtype, **policy_options(cfg.model))
    else:
        model, fmt = new_tiny_policy(
            cfg.model.preset,
            suite.sample_texts(),
            seed=cfg.model.init_seed,
            max_positions=cfg.rollout.max_episode_tokens + 64,
        )
        model.to(DTYPES[cfg.model.dtype])
    return model.to(device or cfg.run.device), fmt


class Trainer:
    """All the state of one run, so that a checkpoint is `state_dict()` and a resume is `load_state_dict()`."""

    def __init__(self, cfg: TrainConfig, out_dir: str | Path):
        self.cfg, self.out = cfg, Path(out_dir)
        self.dist = init_distributed(cfg.run.device)
        self.device = rank_device(cfg.run.device)
        if self.dist.enabled and cfg.run.grad_snr:
            raise ConfigError("run.grad_snr needs the unsharded update: run the cell in one process")
        if self.dist.enabled and cfg.rollout.engine == "vllm" and not cfg.rollout.server:
            # vLLM sets up its own torch.distributed groups on the default group, which the other ranks never join
            raise ConfigError(
                "rollout.engine: vllm in the trainer (rollout.server: false) needs a one-process "
                "cell: with several trainer processes, run vLLM in the rollout server "
                "(rollout.server: true)"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(cfg.run.threads)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)
        r = cfg.rollout

        self.suite = make_suite(cfg.env)
        self._probes: list | None = None  # the cheating probe's impossible tasks, built at the first evaluation
        self.model, self.fmt = build_policy(cfg, self.suite, self.device)
        self.rollout_model = copy.deepcopy(self.model) if self.dist.enabled and self.dist.is_main else None
        """Sharded runs: rank 0's unsharded copy (taken before sharding) for evaluations and the saved policy."""
        compute = torch.bfloat16 if cfg.run.compute_dtype == "bfloat16" else None
        if self.dist.enabled:
            shard_model(self.model, compute_dtype=compute, checkpointing=cfg.run.activation_checkpointing)
            if self.dist.is_main:
                print(
                    f"[trainer] the update is sharded with FSDP2 over {self.dist.world_size} processes",
                    file=sys.stderr,
                    flush=True,
                )
        elif cfg.run.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        if cfg.model.dtype == "bfloat16":
            warnings.warn(
                "model.dtype is bfloat16: the optimizer updates bf16 weights in place, and an update "
                "under half a bf16 step (0.2-0.4% of a weight) rounds away, so at small learning rates the "
                "model stops moving; keep float32 master weights with run.compute_dtype: bfloat16",
                stacklevel=2,
            )
        self.optimizer = build_optimizer(self.model, cfg.optim)
        params, route = dict(self.model.named_parameters()), route_parameters(self.model)
        self.hidden = [params[n] for n, _ in route.muon]
        """The hidden matrices, whose update RMS and spectral norm are logged (and gradient SNR, if asked)."""
        self.embed_head = [params[n] for n, p in route.adamw if p.dim() == 2]
        """The embedding and head matrices: AdamW-trained in every cell (under "muon" at `optim.lr`, the hidden
        matrices at `optim.matrix_lr`), their step sizes logged beside the hidden matrices'."""
        self.estimator = make_estimator(cfg.rl, cfg.shaping)
        # sharded, FSDP2 computes in bf16 itself (its mixed-precision policy); one process autocasts
        self.forward = ForwardSettings(
            autocast_dtype=None if self.dist.enabled else compute,
            chunk_tokens=cfg.run.logprob_chunk_tokens,
        )
        if cfg.run.require_flash_attention:
            check_flash_attention(self.model, torch.device(self.device), compute)

        self.engine = self._rollout_engine() if self.dist.is_main else None
        self.sampling = SamplingParams.for_rollouts(r)
        self.eval_sampling = SamplingParams.for_evaluation(r)
        sampler = TaskSampler(
            self.suite.tasks.tasks("train", cfg.env.train_tasks), self.estimator.sample_tasks, seed=cfg.run.seed
        )
        self.driver = (
            None
            if not self.dist.is_main
            else RolloutDriver(
                self.engine,
                self.suite.make_env,
                sampler,
                r,
                self.sampling,
                self.estimator.dispatch_baseline,
                seed=cfg.run.seed,
                group_size=cfg.rl.group_size,
            )
        )

        resolved = config_to_dict(cfg)
        if self.dist.is_main:  # every key the cell runs with, defaults and recipe included, beside the sparse config
            with atomic_path(self.out / RESOLVED_CONFIG_FILE) as tmp:
                tmp.write_text(yaml.safe_dump(resolved, sort_keys=False))
        provenance = collect_provenance(resolved)
        self.metrics = MetricsLog(self.out / METRICS_FILE, provenance, METRIC_COLUMNS)
        self.episodes = MetricsLog(self.out / EPISODES_FILE, provenance, EPISODE_COLUMNS)
        self.transcripts = MetricsLog(self.out / TRANSCRIPTS_FILE, provenance, TRANSCRIPT_COLUMNS)
        self.updates_done = 0
        """Updates completed so far: the policy version the rollouts sample, and the index of the next update."""
        self.wall_offset = 0.0

    def _rollout_engine(self):
        """Rank 0's engine: in this process (hf, vllm colocated, reference), or a rollout server's client."""
        cfg, r = self.cfg, self.cfg.rollout
        unsharded = self.model if self.rollout_model is None else self.rollout_model
        if r.server:
            from trainer.rollout.server_client import start_cell_server

            return start_cell_server(cfg, self.fmt, unsharded, self.out)
        if r.engine == "vllm":
            from trainer.rollout.vllm_engine import VLLMEngine

            return VLLMEngine(
                cfg.model.path,
                self.fmt,
                dtype=cfg.run.compute_dtype,
                seed=cfg.run.seed,
                gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                max_model_len=r.max_episode_tokens,
                enforce_eager=r.vllm_enforce_eager,
                trust_remote_code=cfg.model.trust_remote_code,
            )
        if r.engine == "reference":
            from trainer.rollout.reference_llm import reference_engine

            return reference_engine(copy.deepcopy(unsharded), self.fmt)
        return HFEngine(copy.deepcopy(unsharded), self.fmt, device=self.device)

    # -- checkpointing -------------------------------------------------------------------------------------------
    def state_dict(self, optimizer: bool = True) -> dict:
        """The run's state as one process holds it, but the weights (collective when sharded, with the optimizer:
        every rank calls it). Without `optimizer` (a sharded checkpoint's DCP shards hold it) or before the first
        optimizer step, "optimizer" is None: gathering an optimizer that has not stepped would initialise it with
        a zero-lr step (torch's state-dict helper), putting AdamW's step count one ahead of an uninterrupted run's.
        The driver's latest weights are left out outside the lagged mode: they are the current weights, which `run`
        publishes again at resume (at paper scale they would be a full copy of the model in rank 0's file)."""
        driver = self.driver.state_dict() if self.driver is not None else None
        if driver is not None and self.cfg.rollout.mode != "lagged" and "latest" in driver:
            driver["latest"] = None
        stepped = optimizer and bool(self.optimizer.state)  # every rank steps alike
        return {
            "format": STATE_FORMAT,
            "config": config_to_dict(self.cfg),
            "update": self.updates_done,
            "optimizer": full_optimizer_state(self.model, self.optimizer, self.dist) if stepped else None,
            "estimator": self.estimator.state_dict(),
            "driver": driver,
            "rng": capture_rng_state(),
            "metrics_rows": self.metrics.rows,
            "episode_rows": self.episodes.rows,
            "transcript_rows": self.transcripts.rows,
            "wall_s": self._wall(),
        }

    def load_state_dict(self, state: dict, model_state: dict | None) -> None:
        """Inverse of `state_dict`, with the weights of a full checkpoint; `model_state` None: the weights and
        optimizer state are in place already (a sharded checkpoint, loaded by `load_sharded_checkpoint`)."""
        if model_state is not None and self.dist.enabled:
            load_full_state(self.model, self.optimizer, model_state, state["optimizer"])
        elif model_state is not None:
            self.model.load_state_dict(model_state)
            if state["optimizer"] is not None:
                self.optimizer.load_state_dict(state["optimizer"])
        self.estimator.load_state_dict(state["estimator"])
        if self.driver is not None:
            self.driver.load_state_dict(state["driver"])
        restore_rng_state(state["rng"])
        self.metrics.rows = state["metrics_rows"]
        self.episodes.rows = state["episode_rows"]
        self.transcripts.rows = state.get("transcript_rows", [])  # none in checkpoints from before transcripts
        self.updates_done = state["update"]
        self.wall_offset = state["wall_s"]

    def checkpoint(self) -> None:
        """Save the run after `updates_done` updates (collective when sharded), the logs flushed first so they never
        lag behind it. `run.checkpoint_format` "full": the weights and optimizer state gathered, one file by rank 0
        (Hugging Face names: it loads in one process); "sharded": DCP, each rank writing its own shards, no gather
        (a 4B model's ~48 GB would otherwise pass through rank 0), rank 0 adding the rest of the state."""
        directory, keep = self.out / CHECKPOINT_DIR, self.cfg.run.keep_checkpoints
        if self.cfg.run.checkpoint_format == "sharded":
            from trainer.checkpoints.sharded import save_sharded_checkpoint  # imports DCP (~1 s)

            extra = self.state_dict(optimizer=False) if self.dist.is_main else None
            if self.dist.is_main:
                self._flush_logs()
            save_sharded_checkpoint(
                directory, step=self.updates_done, model=self.model, optimizer=self.optimizer, extra=extra, keep=keep
            )
            return
        model_state, extra = full_weights(self.model, self.dist), self.state_dict()  # collective when sharded
        if not self.dist.is_main:
            return
        self._flush_logs()
        save_checkpoint(
            directory, step=self.updates_done, model_state=model_state, optimizer_state=None, extra=extra, keep=keep
        )

    def resume(self) -> bool:
        """Continue from the newest readable checkpoint of either format (collective when sharded); False if there
        is none. A sharded one loads on any number of processes (DCP reshards)."""
        ckpt = load_latest_checkpoint(self.out / CHECKPOINT_DIR)
        if ckpt is None:
            return False
        if ckpt["extra"].get("format") != STATE_FORMAT:
            raise ValueError(
                f"{ckpt['path']}: the checkpoint holds trainer state of format "
                f"{ckpt['extra'].get('format')!r}, this trainer reads {STATE_FORMAT!r}; "
                "start in a fresh --out directory"
            )
        difference = self._config_difference(ckpt["extra"]["config"])
        if difference is not None:
            raise ValueError(
                f"{ckpt['path']}: the checkpoint was written with a different config ({difference}); "
                "resume with the same config or start in a fresh --out directory"
            )
        if ckpt["sharded"]:
            from trainer.checkpoints.sharded import load_sharded_checkpoint

            load_sharded_checkpoint(ckpt["path"], self.model, self.optimizer, with_optimizer=ckpt["optimizer"])
        self.load_state_dict(ckpt["extra"], ckpt["model_state"])
        return True

    def _config_difference(self, stored: dict) -> str | None:
        """None when a checkpoint's config is this run's, else the first difference. Read through today's
        dataclasses, so a knob added since the checkpoint was written counts as its default, not as a difference.
        `run.updates` may grow: it only says where the loop stops, so a finished cell's last checkpoint
        (`--checkpoint-last`) continues to more updates as one longer run would have gone on."""
        try:
            then = config_to_dict(config_from_dict(stored))
        except (ConfigError, TypeError) as err:
            return f"it no longer reads as a config: {err}"
        now = config_to_dict(self.cfg)
        for section in now:
            for key in now[section] if isinstance(now[section], dict) else [None]:
                a = then.get(section) if key is None else (then.get(section) or {}).get(key)
                b = now[section] if key is None else now[section][key]
                if (section, key) == ("run", "updates") and a is not None and b >= a:
                    continue
                if a != b:
                    return f"{section if key is None else f'{section}.{key}'}: {a!r} then, {b!r} now"
        return None

    def _wall(self) -> float:
        return self.wall_offset + time.perf_counter() - self.t_start

    # -- one update --------------------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """One batch of rollouts and one policy update; logs the batch's episodes and returns the update's row."""
        u, run = self.updates_done, self.cfg.run
        t0 = time.perf_counter()
        episodes = self.dist.broadcast(self.driver.next_batch(trainer_version=u) if self.dist.is_main else None)
        t1 = time.perf_counter()
        trajs = [e.trajectory() for e in episodes]
        informed = self.estimator.baseline_informed(trajs)
        batch = pad_episodes(episodes, self.fmt.pad_id)
        adv, adv_stats = self.estimator.advantages(trajs, batch)
        self.estimator.before_update(
            episodes,
            functools.partial(
                score_sequences,
                self.model,
                pad_id=self.fmt.pad_id,
                temperature=self.cfg.rollout.temperature,
                device=self.device,
                forward=self.forward,
            ),
        )
        out = policy_update(
            self.model,
            self.optimizer,
            batch,
            adv,
            self.cfg.loss,
            temperature=self.cfg.rollout.temperature,
            minibatches=run.minibatches,
            epochs=run.epochs,
            skip_no_signal=run.skip_no_signal,
            micro_batch_tokens=run.micro_batch_tokens,
            grad_clip=self.cfg.optim.grad_clip,
            stat_matrices=self.hidden,
            embed_head_matrices=self.embed_head,
            ctx=self.dist,
            forward=self.forward,
            grad_parts=[[row] for row in range(len(episodes))] if run.grad_snr else None,
            return_old_logp=self.estimator.needs_old_logp,
        )
        self.estimator.after_update(episodes, trajs, out)
        self.updates_done = u + 1
        self._publish()
        t2 = time.perf_counter()

        staleness = [u - e.oldest_version for e in episodes]
        for i, (e, s) in enumerate(zip(episodes, staleness)):
            # False where the estimator keeps no per-task baseline: no episode's baseline came from data
            self.episodes.append(
                episode_row(
                    e,
                    update=u,
                    split="train",
                    staleness=s,
                    shaping=self.estimator.shaping,
                    baseline_informed=informed[i] if informed is not None else False,
                )
            )
        if run.transcript_every and u % run.transcript_every == 0:
            self._keep_transcripts(episodes, u, "train")
        return update_row(
            update=u,
            policy_version=self.updates_done,
            episodes=episodes,
            trajectories=trajs,
            staleness=staleness,
            advantage_stats=adv_stats,
            update_output=out,
            lr=float(self.optimizer.param_groups[0]["lr"]),
            baseline_informed=informed,
            rollout_s=t1 - t0,
            train_s=t2 - t1,
            wall_s=self._wall(),
        )

    def _publish(self) -> None:
        """Hand the current weights to the rollouts (collective when sharded: rank 0 gathers them). An engine that
        names where it receives them (`weight_target`: a rollout server's wire device and precision) gets them
        gathered straight there, handed over without another copy."""
        target = getattr(self.engine, "weight_target", None)
        device, dtype = target if target is not None else (None, None)
        weights = full_weights(self.model, self.dist, device=device, dtype=dtype)
        if self.driver is not None:
            self.driver.publish(weights, self.updates_done, owned=self.dist.enabled or target is not None)

    def evaluate_heldout(self) -> tuple[float, float | None]:
        """Success on the first `env.eval_tasks` held-out tasks with the current policy (greedy by default), and
        the cheating probe's success on `env.probe_tasks` impossible variants (None when there are none)."""
        tasks = self.suite.tasks.tasks("heldout", self.cfg.env.eval_tasks)
        if self._probes is None:  # built once: a swe variant hashes and may write its tests folder
            impossible = getattr(self.suite.tasks, "impossible", None)
            self._probes = impossible(self.cfg.env.probe_tasks) if impossible and self.cfg.env.probe_tasks else []
        policy = self.model
        if self.dist.enabled:  # rank 0 plays with the gathered weights; the others wait for its numbers
            weights = full_weights(self.model, self.dist)
            if not self.dist.is_main:
                return self.dist.broadcast(None)
            self.rollout_model.load_state_dict(weights)
            policy = self.rollout_model
        success = self._play_and_log(policy, tasks, "eval")
        result = success, (self._play_and_log(policy, self._probes, "impossible") if self._probes else None)
        return self.dist.broadcast(result)

    def _play_and_log(self, policy, tasks, split: str) -> float:
        """Play `tasks` with the evaluation sampling and this update's evaluation generator (what `python -m
        trainer eval` reproduces); log the episodes as `split`; the success rate."""
        success, episodes = evaluate(
            policy,
            self.fmt,
            self.suite.make_env,
            tasks,
            self.eval_sampling,
            eval_generator(self.cfg.run.seed, self.updates_done),
            policy_version=self.updates_done,
            device=self.device,
            env_workers=self.cfg.rollout.env_workers,
        )
        for e in episodes:
            self.episodes.append(
                episode_row(e, update=self.updates_done - 1, split=split, staleness=0, shaping=self.estimator.shaping)
            )
        self._keep_transcripts(episodes, self.updates_done - 1, split)
        return success

    def _flush_logs(self) -> None:
        for log in (self.metrics, self.episodes, self.transcripts):
            log.flush()

    def _keep_transcripts(self, episodes, update: int, split: str) -> None:
        """The first `run.transcript_episodes` episodes' text, into transcripts.parquet."""
        for i, e in enumerate(episodes[: self.cfg.run.transcript_episodes]):
            for row in transcript_rows(e, update=update, split=split, index=i):
                self.transcripts.append(row)

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(
        self,
        resume: bool = False,
        progress: bool | None = None,
        save_policy_to: str | Path | None = None,
        checkpoint_last: bool = False,
        track: Sequence[str] = (),
        track_group: str | None = None,
        track_name: str | None = None,
    ) -> Path:
        """Train to `run.updates` (from the newest checkpoint with `resume`); with `save_policy_to`, write the final
        policy there (a policy directory `eval` and `model.path` read); with `checkpoint_last`, checkpoint the
        finished run too (its optimizer state, for a cell to be continued); `track`: trackers each update's metrics
        also go to (trainer/logs/trackers.py; `track_group` the study, `track_name` the cell). Returns the metrics
        file."""
        self.t_start = time.perf_counter()
        cfg = self.cfg.run
        bar = trackers = None
        try:  # from here on, whatever fails, the rollouts (a server process, environment workers) are closed
            resumed = bool(resume) and self.resume()
            if resumed and self.dist.is_main:
                print(
                    f"[trainer] {self.out.name}: resumed from update {self.updates_done} of {cfg.updates}",
                    file=sys.stderr,
                    flush=True,
                )
            if not resume and list_checkpoints(self.out / CHECKPOINT_DIR):
                raise FileExistsError(
                    f"{self.out / CHECKPOINT_DIR} holds checkpoints of an earlier run: pass "
                    "--resume to continue it, or use a fresh --out directory"
                )
            if track and self.dist.is_main:
                from trainer.logs.trackers import Trackers

                trackers = Trackers(
                    list(track),
                    self.out,
                    config_to_dict(self.cfg),
                    group=track_group,
                    name=track_name,
                    resumed_at=self.updates_done if resumed else None,
                )
            if self.cfg.rollout.mode != "lagged" or self.updates_done == 0:
                self._publish()  # a resumed lagged run has its snapshots back from the checkpoint
            bar = tqdm(
                total=cfg.updates,
                initial=self.updates_done,
                unit="upd",
                desc=self.out.name,
                disable=(None if progress is None else not progress) if self.dist.is_main else True,
            )
            first_update, started, flushed = self.updates_done, time.perf_counter(), time.perf_counter()
            while self.updates_done < cfg.updates:
                row = self.train_step()
                last = self.updates_done == cfg.updates
                # also after the first update: the held-out success of (nearly) the base policy, which later
                # evaluations are compared with
                if cfg.eval_every and (self.updates_done % cfg.eval_every == 0 or self.updates_done == 1 or last):
                    row["eval_success"], row["cheat_rate"] = self.evaluate_heldout()
                self.metrics.append(row)
                if trackers is not None:
                    trackers.log(row, self.updates_done)
                bar.update(1)
                bar.set_postfix(
                    success=f"{row['success_rate']:.2f}", tok_s=f"{row['gen_tokens'] / max(row['rollout_s'], 1e-9):.0f}"
                )
                if self.dist.is_main:
                    per_update = (time.perf_counter() - started) / (self.updates_done - first_update)
                    if bar.disable:  # no bar (a workflow job's log, --no-progress): one line per update instead
                        print(
                            live_line(row, self.updates_done, cfg.updates, per_update),
                            file=sys.stderr,
                            flush=True,
                        )
                    if time.perf_counter() - flushed >= LIVE_FLUSH_S:
                        self._flush_logs()
                        flushed = time.perf_counter()
                if (cfg.checkpoint_every and self.updates_done % cfg.checkpoint_every == 0 and not last) or (
                    last and checkpoint_last
                ):
                    self.checkpoint()
        finally:
            if bar is not None:
                bar.close()
            if trackers is not None:
                trackers.close()
            if self.driver is not None:
                self.driver.close()
            if hasattr(self.engine, "close"):  # a rollout server exits with its trainer
                self.engine.close()
        final = full_weights(self.model, self.dist) if self.dist.enabled and save_policy_to is not None else None
        if self.dist.is_main:
            self._flush_logs()
            if save_policy_to is not None:
                if final is not None:
                    self.rollout_model.load_state_dict(final)
                save_policy(
                    self.rollout_model if final is not None else self.model,
                    self.fmt,
                    save_policy_to,
                    extra={"trained": {"update": self.updates_done, "seed": cfg.seed}},
                )
        return self.out / METRICS_FILE


def live_line(row: dict, done: int, updates: int, seconds_per_update: float) -> str:
    """The update just done (`done` of `updates`; `row` its metrics) as `key=value` fields, which grep and awk
    read: where the cell is, how its policy does, when it ends."""

    def number(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.4g}"

    eta = round(seconds_per_update * (updates - done))
    fields = [
        f"success={number('success_rate')}",
        f"eval={number('eval_success')}",
        f"kl={number('approx_kl')}",
        f"entropy={number('entropy')}",
        f"grad_norm={number('grad_norm')}",
        f"s_per_update={seconds_per_update:.3g}",
        f"eta={eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}",
    ]
    return f"[update {done}/{updates}] " + " ".join(fields)


def train(
    cfg: TrainConfig,
    out_dir: str | Path,
    resume: bool = False,
    progress: bool | None = None,
    save_policy_to: str | Path | None = None,
    checkpoint_last: bool = False,
    **tracking,
) -> Path:
    """One cell (see `Trainer.run`; `tracking`: its `track`, `track_group` and `track_name`)."""
    return Trainer(cfg, out_dir).run(
        resume=resume, progress=progress, save_policy_to=save_policy_to, checkpoint_last=checkpoint_last, **tracking
    )
