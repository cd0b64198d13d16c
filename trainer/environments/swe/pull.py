"""Check or pull every image of a task file ahead of a study, and write the list of tasks whose image is absent.

    python -m trainer.environments.swe.pull --tasks FILE [--pull missing|never] [--absent OUT.tsv] [--row-kind K]

`--pull missing` (default) pulls each absent image once, `--pull never` only looks. OUT.tsv gets one line per task
whose image cannot be had: task id, image, reason (written whole or not at all). Exit status 0 when every image is
there, 1 when some are absent (the list says which), 2 on bad input or no Docker engine. A cell does the same
check when it starts and leaves those tasks out (logged on its standard error), so this command is for seeing
ahead of time what a study will run on, and for pulling R2E-Gym's multi-GB images before the GPUs are booked.
"""

from __future__ import annotations

import argparse
import sys

from trainer.environments.swe.docker_backend import PULL_POLICIES, DockerConfig, missing_images
from trainer.environments.swe.tasks import ROW_KINDS, load_tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.environments.swe.pull", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", required=True, help="task file (.jsonl/.parquet)")
    parser.add_argument(
        "--pull",
        choices=PULL_POLICIES,
        default="missing",
        help="missing: pull absent images; never: only check (default: missing)",
    )
    parser.add_argument("--absent", default=None, help="write the tasks whose image is absent here (TSV)")
    parser.add_argument("--row-kind", choices=ROW_KINDS, default="auto", help="how to read the rows (default: auto)")
    args = parser.parse_args(argv)
    from trainer.atomic import atomic_path
    from trainer.environments.swe.containers import docker_client
    from trainer.environments.swe.sandbox import SandboxError

    try:
        tasks = load_tasks(args.tasks, args.row_kind)
        config = DockerConfig(pull=args.pull)
        absent = missing_images(docker_client(config.start_timeout_s), tasks, config)
    except (OSError, ValueError, ImportError, SandboxError) as exc:
        print(f"pull: {exc}", file=sys.stderr)
        return 2
    images = {task.task_id: task.docker_image for task in tasks}
    if args.absent:
        with atomic_path(args.absent) as tmp:
            tmp.write_text("".join(f"{task_id}\t{images[task_id]}\t{why}\n" for task_id, why in absent.items()))
    print(
        f"{len(tasks) - len(absent)} of {len(tasks)} tasks have their image; {len(absent)} absent"
        + (f" (listed in {args.absent})" if args.absent and absent else ""),
        file=sys.stderr,
    )
    for task_id, why in absent.items():
        print(f"{task_id}\t{images[task_id]}\t{why}")
    return 1 if absent else 0


if __name__ == "__main__":
    sys.exit(main())
