"""Container latencies on the shipped images: what the simulator's stand-in containers draw from, measured.

    python benchmarks/bench_containers.py [--repeats 3] [--standins] [--write sim-containers.yaml]

Each episode is played through the trainer's own `SWEEnv` on the docker backend, one call at a time: `reset`
(a container started from the task's image, the repository checked, the first observation: the simulator's
"start"), tool calls as a policy makes them (a view of the repository root, a search, the gold fix as
`file_editor` edits where the task has one, a test run: its "tool call"), and `finish` (the hidden tests in a
fresh container, read and checked for tampering: its "grading"). The shipped tasks (six small repositories)
always; with `--standins`, the R2E-Gym stand-in images too (`trainer.environments.swe.standins`: R2E-Gym's
layout, a uv interpreter, `/testbed/run_tests.sh`, one with ~90 MB of build artefacts), whose episodes view,
search, run the visible tests and submit the repository unfixed (grading costs the same either way).

Prints, per kind of call, n, the median, the log-normal sigma (standard deviation of the log), p90 and the
maximum; `--write` saves the medians and sigmas as a `simulate --inputs` file. These are small repositories on this
machine: a real R2E-Gym repository's tests take longer, so the grading median is a floor for a paper cell, not its
value (docs/scale.md says which the shipped simulator defaults use).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from trainer.environments.swe import SWEConfig, SWEEnv, SWETasks, oracle_actions
from trainer.environments.swe.tools import format_action

KINDS = ("start", "tool", "grading")


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def actions_for(task, repo_dir: str) -> list[str]:
    """A policy's calls: look around, fix where the task has a gold patch (its test run included), else run the
    visible tests, then submit."""
    look = [
        format_action("file_editor", {"command": "view", "path": repo_dir}),
        format_action("search", {"search_term": "def ", "path": repo_dir}),
    ]
    if task.gold_patch:
        return look + oracle_actions(task, repo_dir)
    return look + [
        format_action(
            "execute_bash", {"cmd": f"{repo_dir}/.venv/bin/python -m pytest -q -x {repo_dir} 2>&1 | tail -5"}
        ),
        format_action("finish", {"command": "submit"}),
    ]


def play(task) -> dict[str, list[float]]:
    """One episode's call latencies by kind (seconds)."""
    env = SWEEnv(SWEConfig(backend="docker"))
    times = {kind: [] for kind in KINDS}
    try:
        t0 = time.perf_counter()
        env.reset(task)
        times["start"].append(time.perf_counter() - t0)
        actions = actions_for(task, env.repo_dir)
        for i, action in enumerate(actions):
            t0 = time.perf_counter()
            result = env.step(action)
            times["grading" if i == len(actions) - 1 else "tool"].append(time.perf_counter() - t0)
            if "is not allowed" in result.observation:  # refused before it reached the container: not a call
                raise RuntimeError(f"task {task.task_id}: the tools refused {action!r}: {result.observation[:200]}")
        if not result.done:
            raise RuntimeError(f"task {task.task_id}: the episode did not end at finish")
    finally:
        env.close()
    return times


def summary(values: list[float]) -> dict[str, float]:
    logs = [math.log(max(v, 1e-6)) for v in values]
    ordered = sorted(values)
    return {
        "n": len(values),
        "median": statistics.median(values),
        "sigma": statistics.stdev(logs) if len(logs) > 1 else 0.0,
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


def standin_tasks_path(directory: Path) -> Path:
    from trainer.environments.swe.standins import build_standins

    path = directory / "standins.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in build_standins()))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="episodes per task")
    parser.add_argument("--standins", action="store_true", help="the R2E-Gym stand-in images too")
    parser.add_argument("--write", type=Path, help="a simulate --inputs file of the measured medians and sigmas")
    args = parser.parse_args()
    from trainer.environments.swe.containers import docker_client

    docker_client(timeout=30)  # no engine: a clear SandboxError here, not in the first episode
    with tempfile.TemporaryDirectory() as tmp:
        sets = {"shipped": [t for t in SWETasks().all if t.docker_image]}
        if args.standins:
            sets["standins"] = list(SWETasks(standin_tasks_path(Path(tmp))).all)
        measured = {name: {kind: [] for kind in KINDS} for name in sets}
        for name, tasks in sets.items():
            for _ in range(args.repeats):
                for task in tasks:
                    for kind, values in play(task).items():
                        measured[name][kind] += values
    print(
        f"# container latencies, docker backend, one call at a time, {args.repeats} episode(s) a task; "
        f"{os.cpu_count()} cores, {cpu_name()}"
    )
    print(f"{'images':<9} {'call':<8} {'n':>4} {'median s':>9} {'sigma':>6} {'p90 s':>7} {'max s':>7}")
    for name, kinds in measured.items():
        for kind, values in kinds.items():
            s = summary(values)
            print(
                f"{name:<9} {kind:<8} {s['n']:>4} {s['median']:>9.3f} {s['sigma']:>6.2f} {s['p90']:>7.3f} "
                f"{s['max']:>7.3f}"
            )
    if args.write:
        pooled = {kind: [v for kinds in measured.values() for v in kinds[kind]] for kind in KINDS}
        inputs = {}
        for kind in KINDS:
            s = summary(pooled[kind])
            inputs[f"{kind}_s_median"] = round(s["median"], 3)
            inputs[f"{kind}_s_sigma"] = round(s["sigma"], 2)
        args.write.write_text(yaml.safe_dump(inputs, sort_keys=False))
        print(f"wrote {args.write} ({', '.join(sets)} pooled)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
