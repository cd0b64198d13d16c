"""Command line: `python -m trainer {train,warm-start,eval} ...`. The workflow calls only this.

    python -m trainer train --config CELL.yaml --out DIR [--resume] [--set loss.tis_cap=null ...]
                            [--exit-with PID|parent] [--save-policy POLICY_DIR] [--checkpoint-last]
    python -m trainer warm-start --config WARM_START.yaml --out DIR [--exit-with PID|parent]
    python -m trainer eval  --config CELL.yaml --policy DIR [--update N] [--tasks 64] [--show 3]
    python -m trainer plan  --config CELL.yaml [--gpus N] [--tokens T] [--no-checkpointing] [--head-chunk C]
                            [--wall-time [--sim-inputs RATES.yaml]]
    python -m trainer export CHECKPOINT --out POLICY_DIR
    python -m trainer simulate [--inputs SIM.yaml] [--gpus 8] [--update-gpus U] [--loop turns|episodes|both]

`eval` plays the held-out tasks as the trainer's evaluation after update N does (same tasks, sampling and
generator), so on the policy `train --save-policy` wrote it prints the `eval_success` the trainer logged for its
last update (N defaults to the update recorded in the policy directory, else 0). `export` writes a checkpoint's
policy (`OUT/checkpoints/ckpt-<step>/`, sharded, or `ckpt-<step>.pt`, full) as `--save-policy` would have after that
step: one process, Hugging Face names, the cell config taken from the checkpoint.

Configs are validated before any work starts; a bad key or value exits with status 2 and a message naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path

import yaml

from trainer.config import ConfigError, load_config, load_warm_start_config
from trainer.process import process_start_time

_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _overrides(pairs: list[str]) -> dict:
    """`a.b=value` pairs (value parsed as YAML) into a nested dict."""
    out: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str) and _EXPONENT.fullmatch(parsed):
            parsed = float(parsed)  # YAML 1.1 reads `1e-3` (no dot) as a string
        node[parts[-1]] = parsed
    return out


def exit_with(pid: int | str, every_s: float = 1.0) -> None:
    """End this process (exit status 143, as SIGTERM) once process `pid` is gone, so that a job whose owner was
    killed outright does not train on as an orphan beside the one a rerun starts. Logs and checkpoints are written
    by rename, so stopping at any instant leaves no half-written file.

    `pid` is a process of this machine: the workflow passes its job's own parent (`$PPID`: the head locally, the
    job's snakemake on one SLURM node). `"parent"` watches the process that started this one, wherever it runs:
    the workflow's choice for a cell over several nodes, where a pid of the batch host means nothing on the other
    nodes (another pid space; at best a missing process, at worst an unrelated one). There each trainer's parent
    is the torchrun agent that `srun` started on its node: SLURM ends the agents when the job ends or fails, and
    a worker whose agent was killed outright (SIGKILL, the OOM killer) is an orphan that SLURM's process
    tracking can lose (proctrack/linuxproc follows the process tree), so it stops itself here."""
    if pid == "parent":
        pid = os.getppid()
        if pid == 0:  # the first process of a pid namespace (a container's): its parent is outside it
            raise ConfigError("--exit-with parent: this process has no parent in its pid namespace")
    born = process_start_time(pid)
    if born is None:
        raise ConfigError(f"--exit-with: process {pid} does not exist")

    def watch() -> None:
        while process_start_time(pid) == born:
            time.sleep(every_s)
        print(f"the process this job belongs to (pid {pid}) is gone: stopping", file=sys.stderr, flush=True)
        os._exit(143)

    threading.Thread(target=watch, name="exit-with", daemon=True).start()


def _exit_target(value: str) -> int | str:
    """`--exit-with`'s value: a process id, or `parent`."""
    if value == "parent":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a process id or 'parent', got {value!r}") from None


def _add_exit_with(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exit-with",
        type=_exit_target,
        metavar="PID|parent",
        help="stop when process PID ends (the workflow's head), or the process that started this one (`parent`)",
    )


def evaluate_cli(cfg, policy: str, *, update: int | None = None, tasks: int | None = None, show: int = 0) -> dict:
    """`eval`: the held-out success of the policy in `policy` under the cell config `cfg`, computed as the trainer's
    evaluation after `update` updates computes it (threads, device, dtype, tasks, sampling, generator)."""
    import torch

    from trainer.environments.suite import make_suite
    from trainer.policy.load import load_policy, policy_meta, policy_options
    from trainer.rollout.evaluation import eval_generator, evaluate, transcript
    from trainer.rollout.sampling import SamplingParams

    if update is None:
        update = policy_meta(policy).get("trained", {}).get("update", 0)
    torch.set_num_threads(cfg.run.threads)
    suite = make_suite(cfg.env)
    model, fmt = load_policy(policy, cfg.model.dtype, **policy_options(cfg.model))
    held_out = suite.tasks.tasks("heldout", tasks or cfg.env.eval_tasks)
    success, episodes = evaluate(
        model,
        fmt,
        suite.make_env,
        held_out,
        SamplingParams.for_evaluation(cfg.rollout),
        eval_generator(cfg.run.seed, update),
        policy_version=update,
        device=cfg.run.device,
        env_workers=cfg.rollout.env_workers,
    )
    for e in episodes[:show]:
        print(transcript(e) + "\n")
    return {"heldout_success": success, "tasks": len(held_out), "update": update, "seed": cfg.run.seed}


def export_checkpoint(checkpoint: str, out: str) -> dict:
    """`export`: the policy of a checkpoint of either format, written into the policy directory `out` (a sharded
    one is read by DCP without a process group, whatever number of processes wrote it)."""
    import torch

    from trainer.checkpoints import read_checkpoint
    from trainer.config import config_from_dict
    from trainer.environments.suite import make_suite
    from trainer.policy.load import save_policy
    from trainer.train import build_policy

    try:
        ckpt = read_checkpoint(checkpoint)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{checkpoint}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None
    cfg = config_from_dict(ckpt["extra"]["config"])
    torch.set_num_threads(cfg.run.threads)
    model, fmt = build_policy(cfg, make_suite(cfg.env) if cfg.model.path is None else None, device="cpu")
    if ckpt["sharded"]:
        from trainer.checkpoints.sharded import load_sharded_weights

        load_sharded_weights(ckpt["path"], model)
    else:
        model.load_state_dict(ckpt["model_state"])
    save_policy(model, fmt, out, extra={"trained": {"update": ckpt["step"], "seed": cfg.run.seed}})
    return {"policy": str(out), "update": ckpt["step"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--debug",
        action="store_true",
        help="on an error, print the whole traceback (otherwise one line, the traceback in OUT/error.log)",
    )
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one cell of the grid")
    t.add_argument("--config", required=True, help="cell config (YAML)")
    t.add_argument("--out", required=True, help="output directory (metrics.parquet, episodes.parquet, checkpoints)")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    t.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    t.add_argument("--no-progress", action="store_true")
    _add_exit_with(t)
    t.add_argument("--save-policy", metavar="DIR", help="write the final policy into DIR (for `eval`, `model.path`)")
    t.add_argument(
        "--checkpoint-last", action="store_true", help="checkpoint after the last update too (a cell to continue)"
    )
    t.add_argument(
        "--track", nargs="+", default=[], metavar="TRACKER", help="also log each update to: tensorboard, wandb"
    )
    t.add_argument("--track-group", help="the trackers' group (a study's name)")
    t.add_argument("--track-name", help="the trackers' run name (default: the --out folder's name)")

    s = sub.add_parser("warm-start", help="supervised warm start of a tiny base policy")
    s.add_argument("--config", required=True)
    s.add_argument("--out", required=True, help="policy directory to write")
    s.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--allow-out-of-band", action="store_true", help="exit 0 even if held-out success missed the band")
    _add_exit_with(s)

    e = sub.add_parser("eval", help="held-out success of a policy")
    e.add_argument("--config", required=True)
    e.add_argument("--policy", required=True, help="policy directory")
    e.add_argument(
        "--update",
        type=int,
        default=None,
        help="seed the evaluation as the trainer's after this update (default: the policy's own, else 0)",
    )
    e.add_argument("--tasks", type=int, default=None, help="held-out tasks (default: env.eval_tasks)")
    e.add_argument("--show", type=int, default=0, help="print the first N episodes as transcripts")

    x = sub.add_parser("export", help="a checkpoint's policy as a policy directory (for `eval`, `model.path`)")
    x.add_argument("checkpoint", help="a ckpt-<step>/ directory (sharded) or ckpt-<step>.pt file (full)")
    x.add_argument("--out", required=True, help="policy directory to write")

    from trainer import plan

    plan.add_arguments(sub.add_parser("plan", help="predicted GPU memory of a cell's update (exit 1: does not fit)"))
    from trainer.rollout import simulate

    simulate.add_arguments(
        sub.add_parser("simulate", help="a paper cell's wall time on a virtual clock, per loop and GPU placement")
    )

    from trainer.logs import transcripts

    transcripts.add_arguments(sub.add_parser("show", help="what the policy typed: a cell's transcripts as text"))
    from trainer import status

    status.add_arguments(sub.add_parser("status", help="where a study stands: each warm start and cell's state"))

    args = ap.parse_args(argv)
    try:
        if getattr(args, "exit_with", None) is not None:
            exit_with(args.exit_with)
        if args.command == "train":
            cfg = load_config(args.config, _overrides(args.set))
            from trainer.train import train

            path = train(
                cfg,
                args.out,
                resume=args.resume,
                progress=False if args.no_progress else None,
                save_policy_to=args.save_policy,
                checkpoint_last=args.checkpoint_last,
                track=args.track,
                track_group=args.track_group,
                track_name=args.track_name,
            )
            if os.environ.get("RANK", "0") == "0":  # one line, also under torchrun
                print(f"wrote {path}")
        elif args.command == "warm-start":
            cfg = load_warm_start_config(args.config, _overrides(args.set))
            from trainer.warm_start import warm_start

            report = warm_start(cfg, args.out, progress=False if args.no_progress else None)
            print(json.dumps({k: report[k] for k in ("in_band", "heldout_success", "step", "seconds")}))
            if not report["in_band"] and not args.allow_out_of_band:
                print(
                    f"warm start: held-out success {report['heldout_success']:.3f} is outside the band "
                    f"{report['band']}",
                    file=sys.stderr,
                )
                return 1
        elif args.command == "plan":
            return plan.run(args)
        elif args.command == "simulate":
            return simulate.run(args)
        elif args.command == "status":
            return status.run(args)
        elif args.command == "show":
            return transcripts.run(args)
        elif args.command == "export":
            print(json.dumps(export_checkpoint(args.checkpoint, args.out)))
        else:
            cfg = load_config(args.config, {"model": {"path": args.policy}})
            print(json.dumps(evaluate_cli(cfg, args.policy, update=args.update, tasks=args.tasks, show=args.show)))
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing to say, and nothing more to flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:
        from trainer.study import StudyError  # imported here: it takes pandas, which most commands do without

        if isinstance(err, StudyError):
            print(f"config error: {err}", file=sys.stderr)
            return 2
        return report_error(err, args)
    return 0


def report_error(err: Exception, args: argparse.Namespace) -> int:
    """One line for an error that is not the config's (a resume mismatch, a missing vLLM, a dead rollout server),
    the traceback kept in the cell's folder (`train`: OUT/error.log), or printed with --debug. Exit 1."""
    trace = traceback.format_exc()
    if args.debug:
        print(trace, file=sys.stderr, end="")
        return 1
    kept = None
    out = args.out if args.command == "train" else None  # warm-start's and export's --out is a policy directory
    if out is not None:
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
            rank = os.environ.get("RANK", "0")  # under torchrun each rank keeps its own
            kept = Path(out) / ("error.log" if rank == "0" else f"error-rank{rank}.log")
            kept.write_text(trace)
        except OSError:
            kept = None
    where = f"traceback in {kept}" if kept else "the traceback: python -m trainer --debug ..."
    print(f"error: {type(err).__name__}: {err} ({where})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
