"""The program each grid cell runs: rollouts -> advantages -> policy update -> logs, `run.updates` times.

Read top to bottom: build everything from the config, resume from the newest checkpoint if asked, then loop.
Every source of randomness is an explicit generator (task sampling, token sampling, evaluation) or a seeded global
that is checkpointed, so the deterministic modes (`sync`, `lagged`) rerun bit for bit, also across a SIGKILL and
`--resume`. Timing columns (rollout_s, train_s, wall_s) are the only ones that differ between such runs.
"""
from __future__ import annotations

import copy
import random
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from trainer.config import TrainConfig, config_to_dict
from trainer.environments.suite import make_suite
from trainer.logs.checkpoint import capture_rng_state, load_latest_checkpoint, restore_rng_state, save_checkpoint
from trainer.logs.parquet_log import EPISODE_COLUMNS, METRIC_COLUMNS, MetricsLog
from trainer.logs.provenance import collect_provenance
from trainer.optim.hybrid import build_muon_adamw, route_parameters
from trainer.policy.load import DTYPES, load_policy, new_tiny_policy
from trainer.rl.advantages import AdvantageConfig, compute_advantages
from trainer.rl.group_advantages import GiGPOConfig, GraphGPOConfig
from trainer.rl.shaping import ShapingConfig, overlong_flags
from trainer.rl.spo import (BetaTracker, SPOPlusPlusConfig, TrackerConfig, logprob_divergence, read_offline_stats,
                            spo_update_tracker, update_tracker_in_arrival_order)
from trainer.rollout.driver import DriverConfig, RolloutDriver, TaskSampler
from trainer.rollout.hf_engine import HFEngine, SamplingParams
from trainer.update import LossSettings, pad_episodes, policy_update, token_logprobs

METRICS_FILE, EPISODES_FILE, CHECKPOINT_DIR = "metrics.parquet", "episodes.parquet", "checkpoints"


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name in ("adam", "adam_high_lr"):
        return torch.optim.AdamW(model.parameters(), lr=o.lr if o.name == "adam" else o.muon_lr, betas=o.betas,
                                 weight_decay=o.weight_decay, foreach=True)
    return build_muon_adamw(model, muon_lr=o.lr if o.muon_lr is None else o.muon_lr,
                            muon_weight_decay=o.muon_weight_decay, adamw_lr=o.lr,
                            adamw_weight_decay=o.weight_decay, betas=o.betas, momentum=o.momentum,
                            nesterov=o.nesterov, ns_coefficients=o.ns_coefficients, adjust_lr_fn=o.adjust_lr_fn)


def advantage_config(cfg: TrainConfig) -> AdvantageConfig:
    r = cfg.rl
    return AdvantageConfig(
        estimator=r.estimator,
        shaping=ShapingConfig(length_penalty=r.length_penalty, tool_penalty=r.tool_penalty,
                              length_threshold=r.length_threshold, length_ramp=r.length_ramp),
        spo_plus_plus=SPOPlusPlusConfig(baseline=r.spo_baseline, unit=r.spo_unit),
        gigpo=GiGPOConfig(omega=r.gigpo_omega, gamma=r.gamma),
        graphgpo=GraphGPOConfig(convention=r.graph_convention))


class Trainer:
    """All the state of one run, so that a checkpoint is `state_dict()` and a resume is `load_state_dict()`."""

    def __init__(self, cfg: TrainConfig, out_dir: str | Path):
        self.cfg, self.out = cfg, Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(cfg.run.threads)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)

        self.suite = make_suite(cfg.env)
        self._probes: list | None = None  # the cheating probe's impossible tasks, built at the first evaluation
        if cfg.model.path is not None:
            self.model, self.fmt = load_policy(cfg.model.path, cfg.model.dtype)
        else:
            self.model, self.fmt = new_tiny_policy(cfg.model.preset, self.suite.sample_texts(),
                                                   seed=cfg.model.init_seed,
                                                   max_positions=cfg.rollout.max_episode_tokens + 64)
            self.model.to(DTYPES[cfg.model.dtype])
        self.model.to(cfg.run.device)
        if cfg.model.dtype == "bfloat16":
            warnings.warn("model.dtype is bfloat16: the optimizer updates bf16 weights in place, and an update "
                          "under half a bf16 step (0.2-0.4% of a weight) rounds away, so at small learning rates the "
                          "model stops moving; keep float32 master weights with run.compute_dtype: bfloat16",
                          stacklevel=2)
        self.optimizer = build_optimizer(self.model, cfg)
        names = [n for n, _ in route_parameters(self.model).muon]
        params = dict(self.model.named_parameters())
        self.hidden = [params[n] for n in names]

        self.adv_cfg = advantage_config(cfg)
        self.tracker = None
        if cfg.rl.estimator in ("spo", "spo++"):
            stats = read_offline_stats(cfg.rl.offline_stats) if cfg.rl.offline_stats else {}
            self.tracker = BetaTracker.from_offline(stats, TrackerConfig(rho_mode=cfg.rl.rho_mode))
        self.last_visit: dict[str, tuple[list[int], list[float], list[float]]] = {}
        """SPO's KL-adaptive rho: per task, the previous visit's tokens, loss mask and trainer log-probs."""

        if cfg.rollout.engine == "vllm":
            from trainer.rollout.vllm_engine import VLLMEngine
            self.engine = VLLMEngine(cfg.model.path, self.fmt, dtype=cfg.run.compute_dtype, seed=cfg.run.seed,
                                     gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
                                     max_model_len=cfg.rollout.max_episode_tokens)
        else:
            self.engine = HFEngine(copy.deepcopy(self.model), self.fmt, device=cfg.run.device)
        self.eval_engine = HFEngine(self.model, self.fmt, device=cfg.run.device)
        r = cfg.rollout
        self.sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, max_turn_tokens=r.max_turn_tokens,
                                       max_episode_tokens=r.max_episode_tokens)
        self.eval_sampling = SamplingParams(temperature=r.eval_temperature, top_p=1.0,
                                            max_turn_tokens=r.max_turn_tokens,
                                            max_episode_tokens=r.max_episode_tokens)
        sampler = TaskSampler(self.suite.tasks.tasks("train", cfg.env.train_tasks), self.tracker,
                              cfg.rl.prioritised_sampling,
                              seed=cfg.run.seed)
        self.driver = RolloutDriver(self.engine, self.suite.make_env, sampler,
                                    DriverConfig(mode=r.mode, lag=r.lag, max_staleness=r.max_staleness,
                                                 batch_size=r.batch_size, group_size=cfg.rl.group_size,
                                                 prioritised=cfg.rl.prioritised_sampling),
                                    self.sampling, self.tracker, seed=cfg.run.seed)
        self.loss_cfg = LossSettings(clip_low=cfg.rl.clip_low, clip_high=cfg.rl.clip_high, tis_cap=cfg.rl.tis_cap,
                                     agg=cfg.rl.agg, dual_clip=cfg.rl.dual_clip,
                                     temperature=r.temperature if r.temperature > 0 else 1.0)
        self.autocast = torch.bfloat16 if cfg.run.compute_dtype == "bfloat16" else None

        provenance = collect_provenance(config_to_dict(cfg))
        self.metrics = MetricsLog(self.out / METRICS_FILE, provenance, METRIC_COLUMNS)
        self.episodes = MetricsLog(self.out / EPISODES_FILE, provenance, EPISODE_COLUMNS)
        self.update = 0
        self.wall_offset = 0.0

    # -- checkpointing -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"config": config_to_dict(self.cfg), "update": self.update, "optimizer": self.optimizer.state_dict(),
                "tracker": self.tracker.state_dict() if self.tracker else None, "last_visit": self.last_visit,
                "driver": self.driver.state_dict(), "rng": capture_rng_state(),
                "metrics_rows": self.metrics.rows, "episode_rows": self.episodes.rows, "wall_s": self._wall()}

    def load_state_dict(self, state: dict, model_state: dict) -> None:
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.tracker is not None:
            self.tracker.load_state_dict(state["tracker"])
        self.last_visit = state["last_visit"]
        self.driver.load_state_dict(state["driver"])
        restore_rng_state(state["rng"])
        self.metrics.rows = state["metrics_rows"]
        self.episodes.rows = state["episode_rows"]
        self.update = state["update"]
        self.wall_offset = state["wall_s"]

    def checkpoint(self) -> None:
        self.metrics.flush()
        self.episodes.flush()
        save_checkpoint(self.out / CHECKPOINT_DIR, step=self.update, model_state=self.model.state_dict(),
                        optimizer_state=None, extra=self.state_dict(), keep=self.cfg.run.keep_checkpoints)

    def resume(self) -> bool:
        ckpt = load_latest_checkpoint(self.out / CHECKPOINT_DIR)
        if ckpt is None:
            return False
        if ckpt["extra"]["config"] != config_to_dict(self.cfg):
            raise ValueError(f"{ckpt['path']}: the checkpoint was written with a different config; "
                             "resume with the same config or start in a fresh --out directory")
        self.load_state_dict(ckpt["extra"], ckpt["model_state"])
        return True

    def _wall(self) -> float:
        return self.wall_offset + time.perf_counter() - self.t_start

    # -- one update --------------------------------------------------------------------------------------------
    def _rhos(self, episodes) -> dict[str, float]:
        """SPO's forgetting factor per task: KL-adaptive from the previous visit's response, or constant.
        The previous responses are re-scored in one padded forward pass (one per update, not one per task)."""
        rhos, revisits = {}, []
        for e in episodes:
            prev = self.last_visit.get(e.task_id) if self.cfg.rl.rho_mode == "kl_adaptive" else None
            if prev is None:
                rhos[e.task_id] = self.tracker.rho(None)
            else:
                revisits.append((e.task_id, prev))
        if not revisits:
            return rhos
        with torch.no_grad():
            batch = pad_episodes([_token_only_episode(tokens, mask) for _, (tokens, mask, _) in revisits],
                                 self.fmt.pad_id).to(self.cfg.run.device)
            logp_now = token_logprobs(self.model, batch, self.loss_cfg.temperature,
                                      autocast_dtype=self.autocast).cpu()
        for row, (task_id, (tokens, mask, logp_then)) in enumerate(revisits):
            n = len(tokens) - 1
            d = logprob_divergence(torch.tensor(logp_then), logp_now[row, :n],
                                   torch.tensor(mask[1:], dtype=torch.float32))
            rhos[task_id] = self.tracker.rho(d)
        return rhos

    def _grad_parts(self, episodes) -> list[list[int]] | None:
        """One part per episode for `grad_snr` (per-episode gradients); None when the statistic is off."""
        return [[row] for row in range(len(episodes))] if self.cfg.run.grad_snr else None

    def train_step(self) -> dict:
        u = self.update
        t0 = time.perf_counter()
        episodes = self.driver.next_batch(trainer_version=u)
        t1 = time.perf_counter()
        trajs = [e.trajectory() for e in episodes]
        informed = [self.tracker is not None and t.task_id in self.tracker for t in trajs]
        batch = pad_episodes(episodes, self.fmt.pad_id)
        adv_tokens, adv_stats = compute_advantages(trajs, self.adv_cfg, self.tracker, width=batch.width + 1)
        adv = adv_tokens[:, 1:] * batch.loss_mask
        rhos = self._rhos(episodes) if self.tracker is not None else {}
        out = policy_update(self.model, self.optimizer, batch, adv, self.loss_cfg,
                            minibatches=self.cfg.run.minibatches, epochs=self.cfg.run.epochs,
                            skip_no_signal=self.cfg.run.skip_no_signal, micro_batch_tokens=self.cfg.run.micro_batch_tokens,
                            grad_clip=self.cfg.optim.grad_clip, autocast_dtype=self.autocast,
                            stat_matrices=self.hidden, grad_parts=self._grad_parts(episodes),
                            return_old_logp=self.tracker is not None and self.cfg.rl.rho_mode == "kl_adaptive")
        if self.tracker is not None:
            if self.cfg.rl.estimator == "spo":
                spo_update_tracker(trajs, self.tracker, [rhos[t.task_id] for t in trajs])
            else:
                update_tracker_in_arrival_order(trajs, self.tracker, lambda t: rhos[t.task_id])
            if self.cfg.rl.rho_mode == "kl_adaptive":
                for e, lp in zip(episodes, out.pop("old_logp_rows")):
                    self.last_visit[e.task_id] = (list(e.tokens), list(e.loss_mask), lp)
        out.pop("old_logp_rows", None)
        self.update = u + 1
        self.driver.publish(self.model.state_dict(), self.update)
        t2 = time.perf_counter()

        staleness = [u - e.oldest_version for e in episodes]
        gen = [e.n_generated for e in episodes]
        shaping = self.adv_cfg.shaping
        row = {"update": u, "policy_version": self.update, "n_trajectories": len(episodes), "gen_tokens": sum(gen),
               "success_rate": float(np.mean([t.success for t in trajs])),
               "reward_mean": float(np.mean([t.reward for t in trajs])),
               "response_len_mean": float(np.mean(gen)), "turns_mean": float(np.mean([len(t.turns) for t in trajs])),
               "tool_error_rate": adv_stats["tool_error_rate"], "overlong_rate": adv_stats["overlong_rate"],
               "advantage_std": adv_stats["advantage_std"], "staleness_mean": float(np.mean(staleness)),
               "staleness_max": float(max(staleness)), "lr": float(self.optimizer.param_groups[0]["lr"]),
               "optimizer_steps": out["steps"], "skipped_steps": out["skipped_steps"],
               "baseline_informed_frac": float(np.mean(informed)) if self.tracker is not None else None,
               "rollout_s": t1 - t0, "train_s": t2 - t1, "wall_s": self._wall()}
        for k in ("entropy", "approx_kl", "clip_frac_low", "clip_frac_high", "tis_weight_mean", "tis_truncated_frac",
                  "grad_norm", "update_rms", "update_spectral_norm", "loss"):
            row[k] = out.get(k)  # None (null) when every step was skipped
        if "grad_snr" in out:
            row["grad_snr"] = out["grad_snr"]
        for e, t, s, known in zip(episodes, trajs, staleness, informed):
            self.episodes.append({"update": u, "task_id": e.task_id, "reward": e.reward, "success": t.success,
                                  "n_turns": len(t.turns), "gen_tokens": e.n_generated, "length": e.length,
                                  "truncated": e.truncated, "staleness": s, "policy_version": e.oldest_version,
                                  "tool_errors": sum(turn.tool_error for turn in t.turns),
                                  "overlong_turns": int(overlong_flags(t.turns, shaping).sum()), "split": "train",
                                  "baseline_informed": known})
        return row

    def evaluate(self) -> tuple[float, float | None]:
        """Success on the first `env.eval_tasks` held-out tasks with the current policy (greedy by default), and
        the cheating probe's success on `env.probe_tasks` impossible variants (None when there are none)."""
        tasks = self.suite.tasks.tasks("heldout", self.cfg.env.eval_tasks)
        if self._probes is None:  # built once: a swe variant hashes and may write its tests folder
            impossible = getattr(self.suite.tasks, "impossible", None)
            self._probes = impossible(self.cfg.env.probe_tasks) if impossible and self.cfg.env.probe_tasks else []
        success = self._play_eval(tasks, "eval") if tasks else float("nan")
        return success, (self._play_eval(self._probes, "impossible") if self._probes else None)

    def _play_eval(self, tasks, split: str) -> float:
        """Play `tasks` once each with the evaluation sampling; log the episodes as `split`; the success rate."""
        generator = torch.Generator().manual_seed(self.cfg.run.seed * 1_000_003 + self.update)
        envs = [self.suite.make_env() for _ in tasks]
        self.model.eval()
        try:
            with torch.no_grad():
                episodes = self.eval_engine.play(envs, tasks, sampling=self.eval_sampling,
                                                 policy_version=self.update, generator=generator,
                                                 task_ids=[t.task_id for t in tasks])
        finally:
            for env in envs:
                env.close()
        for e in episodes:
            t = e.trajectory()
            self.episodes.append({"update": self.update - 1, "task_id": e.task_id, "reward": e.reward,
                                  "success": t.success, "n_turns": len(t.turns), "gen_tokens": e.n_generated,
                                  "length": e.length, "truncated": e.truncated, "staleness": 0,
                                  "policy_version": self.update, "tool_errors": sum(x.tool_error for x in t.turns),
                                  "overlong_turns": int(overlong_flags(t.turns, self.adv_cfg.shaping).sum()),
                                  "split": split})
        return float(np.mean([e.reward > 0.5 for e in episodes]))

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self, resume: bool = False, progress: bool | None = None) -> Path:
        self.t_start = time.perf_counter()
        if resume:
            self.resume()
        elif list((self.out / CHECKPOINT_DIR).glob("ckpt-*.pt")):
            raise FileExistsError(f"{self.out / CHECKPOINT_DIR} holds checkpoints of an earlier run: pass --resume "
                                  "to continue it, or use a fresh --out directory")
        cfg = self.cfg.run
        if self.driver.cfg.mode != "lagged" or not self.driver.snapshots:
            self.driver.publish(self.model.state_dict(), self.update)
        bar = tqdm(total=cfg.updates, initial=self.update, disable=None if progress is None else not progress,
                   desc=self.out.name, unit="upd")
        try:
            while self.update < cfg.updates:
                row = self.train_step()
                last = self.update == cfg.updates
                # also after the first update: the held-out success of (nearly) the base policy, which later
                # evaluations are compared with
                if cfg.eval_every and (self.update % cfg.eval_every == 0 or self.update == 1 or last):
                    row["eval_success"], row["cheat_rate"] = self.evaluate()
                self.metrics.append(row)
                bar.update(1)
                bar.set_postfix(success=f"{row['success_rate']:.2f}",
                                tok_s=f"{row['gen_tokens'] / max(row['rollout_s'], 1e-9):.0f}")
                if cfg.checkpoint_every and self.update % cfg.checkpoint_every == 0 and not last:
                    self.checkpoint()
        finally:
            bar.close()
            self.driver.close()
        self.metrics.flush()
        self.episodes.flush()
        return self.out / METRICS_FILE


def _token_only_episode(tokens: list[int], mask: list[int]):
    from trainer.rollout.episode import Episode
    e = Episode(task_id="")
    e.tokens, e.loss_mask = list(tokens), list(mask)
    e.rollout_logp, e.versions = [0.0] * len(tokens), [0] * len(tokens)
    return e


def train(cfg: TrainConfig, out_dir: str | Path, resume: bool = False, progress: bool | None = None) -> Path:
    return Trainer(cfg, out_dir).run(resume=resume, progress=progress)
