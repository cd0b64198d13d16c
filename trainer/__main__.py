"""Command line: `python -m trainer {train,sft,eval} ...`. The workflow calls only this.

    python -m trainer train --config CELL.yaml --out DIR [--resume] [--set rl.tis_cap=null ...] [--exit-with PID]
    python -m trainer sft   --config SFT.yaml  --out DIR [--exit-with PID]
    python -m trainer eval  --config CELL.yaml --policy DIR [--tasks 64]

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

import yaml

from trainer.config import ConfigError, load_config, load_sft_config
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


def exit_with(pid: int, every_s: float = 1.0) -> None:
    """End this process (exit status 143, as SIGTERM) once process `pid` is gone: the workflow passes its head's
    pid, so that a head killed outright does not leave its jobs training as orphans beside the ones a rerun
    starts. Logs and checkpoints are written by rename, so stopping at any instant leaves no half-written file."""
    born = process_start_time(pid)
    if born is None:
        raise ConfigError(f"--exit-with: process {pid} does not exist")

    def watch() -> None:
        while process_start_time(pid) == born:
            time.sleep(every_s)
        print(f"the process this job belongs to (pid {pid}) is gone: stopping", file=sys.stderr, flush=True)
        os._exit(143)

    threading.Thread(target=watch, name="exit-with", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one cell of the grid")
    t.add_argument("--config", required=True, help="cell config (YAML)")
    t.add_argument("--out", required=True, help="output directory (metrics.parquet, episodes.parquet, checkpoints)")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    t.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--exit-with", type=int, metavar="PID", help="stop when process PID ends (the workflow's head)")

    s = sub.add_parser("sft", help="supervised warm start of a tiny base policy")
    s.add_argument("--config", required=True)
    s.add_argument("--out", required=True, help="policy directory to write")
    s.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--allow-out-of-band", action="store_true",
                   help="exit 0 even if held-out success missed the band")
    s.add_argument("--exit-with", type=int, metavar="PID", help="stop when process PID ends (the workflow's head)")

    e = sub.add_parser("eval", help="held-out success of a policy")
    e.add_argument("--config", required=True)
    e.add_argument("--policy", required=True, help="policy directory")
    e.add_argument("--tasks", type=int, default=None, help="held-out tasks (default: env.eval_tasks)")
    e.add_argument("--show", type=int, default=0, help="print the first N episodes as transcripts")

    args = ap.parse_args(argv)
    try:
        if getattr(args, "exit_with", None) is not None:
            exit_with(args.exit_with)
        if args.command == "train":
            cfg = load_config(args.config, _overrides(args.set))
            from trainer.train import train
            path = train(cfg, args.out, resume=args.resume, progress=False if args.no_progress else None)
            print(f"wrote {path}")
        elif args.command == "sft":
            cfg = load_sft_config(args.config, _overrides(args.set))
            from trainer.policy.sft import warm_start
            report = warm_start(cfg, args.out, progress=False if args.no_progress else None)
            print(json.dumps({k: report[k] for k in ("in_band", "heldout_success", "step", "seconds")}))
            if not report["in_band"] and not args.allow_out_of_band:
                print(f"warm start: held-out success {report['heldout_success']:.3f} is outside the band "
                      f"{report['band']}", file=sys.stderr)
                return 1
        else:
            cfg = load_config(args.config, {"model": {"path": args.policy}})
            from trainer.environments.suite import make_suite
            from trainer.policy.load import load_policy
            from trainer.policy.sft import evaluate_policy
            from trainer.rollout.hf_engine import SamplingParams
            suite = make_suite(cfg.env)
            model, fmt = load_policy(args.policy, cfg.model.dtype)
            tasks = suite.tasks.tasks("heldout", args.tasks or cfg.env.eval_tasks)
            r = cfg.rollout
            shown: list[str] = []
            success = evaluate_policy(model, fmt, suite, tasks, SamplingParams(
                temperature=r.eval_temperature, top_p=1.0, max_turn_tokens=r.max_turn_tokens,
                max_episode_tokens=r.max_episode_tokens), seed=cfg.run.seed, transcripts=shown)
            for text in shown[:args.show]:
                print(text + "\n")
            print(json.dumps({"heldout_success": success, "tasks": len(tasks)}))
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
