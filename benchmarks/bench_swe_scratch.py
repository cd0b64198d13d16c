"""What the Docker sandbox's scratch places cost on R2E-Gym-style images: container start and grading, scratch
(the image's /testbed and /root copied into bounded tmpfs places) beside the image's writable layer.

Each row is the median of `--repeats` episodes of an R2E-Gym stand-in (`trainer/environments/swe/standins.py`,
built first if absent): reset, the row's own fix written, `finish` (graded in a fresh container). Both modes run
side by side in one process, so the ratio is what to read; record the machine and Docker's storage driver with
it (vfs copies an image's whole root filesystem for every container in either mode).

    python benchmarks/bench_swe_scratch.py [--layouts py39-pytest62 py311-pytest83-large] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from trainer.environments.swe import DockerConfig, SWEConfig, SWEEnv, format_action
from trainer.environments.swe.containers import docker_client
from trainer.environments.swe.standins import LAYOUTS, build_standins
from trainer.environments.swe.tasks import commit_fix, task_from_record


def episode(client, task, scratch: bool) -> tuple[float, float]:
    """(seconds to start, seconds to grade) of one episode of the task's own fix."""
    env = SWEEnv(SWEConfig(backend="docker", docker=DockerConfig(scratch=scratch)), docker_client=client)
    started = time.monotonic()
    env.reset(task)
    ready = time.monotonic()
    for path, text in commit_fix(task.extra["parsed_commit_content"]).items():
        env.backend.write_file(f"/testbed/{path}", text.encode())
    last = env.step(format_action("finish", {"command": "submit"}))
    if last.reward != 1.0:
        raise RuntimeError(f"{task.task_id}: its own fix graded {last.reward}: {last.info.extra}")
    return ready - started, time.monotonic() - ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", nargs="*", default=["py39-pytest62", "py311-pytest83-large"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    client = docker_client(timeout=600)
    layouts = [layout for layout in LAYOUTS if layout.name in args.layouts]
    rows = build_standins(client, layouts)
    print(f"storage driver: {client.info().get('Driver')}")
    print("| stand-in | scratch: start | scratch: grade | writable layer: start | writable layer: grade |")
    print("|---|---|---|---|---|")
    for layout, row in zip(layouts, rows):
        task = task_from_record(row, None, where=layout.name)
        times = {}
        for scratch in (True, False):
            runs = [episode(client, task, scratch) for _ in range(args.repeats)]
            times[scratch] = [statistics.median(r[k] for r in runs) for k in (0, 1)]
        cells = [f"{seconds:.1f} s" for scratch in (True, False) for seconds in times[scratch]]
        print(f"| {layout.name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
