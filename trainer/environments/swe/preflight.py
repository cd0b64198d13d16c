"""The preflight: does each repository's row grade a correct fix 1 and no change 0, here, before any GPU is booked?

    python -m trainer.environments.swe.preflight --tasks FILE [--options JSON] [--rows-per-repository 2]
        [--workers 4] [--min-gold-share 0.9] [--out preflight.tsv]

`snakemake preflight` runs it on a study's task file with the study's sandbox settings (`env.options`), and every
cell of such a study waits for it. Three steps:

1. **Images**: every image of the task file is made present by the pull policy, `workers` at a time (one absent
   image is a problem of its rows, not an error).
2. **A sample**: the first `rows_per_repository` rows of each repository, in file order (deterministic; a
   repository's rows share an image layout, test runner and conftest, which is what can break grading).
3. **Two gradings per row**, through the real sandbox and grader with the study's settings: the row's own fix
   (R2E-Gym's `parsed_commit_content`, its files outside R2E-Gym's test files; the shipped rows' `gold_patch`) and
   no change at all.

The table (one row per sampled task: task_id, repository, image, image_bytes, gold_reward, noop_reward, reading,
problems, seconds) goes to `--out` (written whole or not at all) and to standard output. Problems named: an absent
image, no fix in the row, a fix graded 0 (with the tests that differ), a fix flagged as tampering (a false flag,
which `on_tamper: zero` would make a 0), an unchanged repository graded 1 (the row cannot tell a fix from none), a
sandbox that failed. The exit status is 1 when the share of sampled rows whose fix grades 1 is below
`min_gold_share`, naming it; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainer.atomic import atomic_path
from trainer.environments.protocol import EpisodeStartError
from trainer.environments.swe.tasks import SWETask, commit_fix, load_tasks

COLUMNS = (
    "task_id",
    "repository",
    "image",
    "image_bytes",
    "gold_reward",
    "noop_reward",
    "reading",
    "problems",
    "seconds",
)


def sample(tasks: Sequence[SWETask], rows_per_repository: int) -> list[SWETask]:
    """The first `rows_per_repository` rows of each repository (`repo_name`, else the image's repository), in file
    order."""
    taken: dict[str, int] = {}
    chosen = []
    for task in tasks:
        repository = task.repo_name or task.docker_image.rsplit(":", 1)[0]
        if taken.get(repository, 0) < rows_per_repository:
            taken[repository] = taken.get(repository, 0) + 1
            chosen.append(task)
    return chosen


def gold_fix(task: SWETask) -> dict[str, str | None] | None:
    """{path: new text, None to delete} of the row's own fix; None when the row carries none."""
    if "parsed_commit_content" in task.extra:
        return commit_fix(task.extra["parsed_commit_content"])
    if task.gold_patch:
        return {}  # applied as the oracle agent applies it (`oracle_actions`)
    return None


def grade_once(config, task: SWETask, fix: dict | None, client=None) -> dict:
    """One episode: the fix written into the repository (None: no change), then `finish`. Its reward and what
    grading saw, or the sandbox's failure."""
    from trainer.environments.swe import SWEEnv, format_action, oracle_actions

    env = SWEEnv(config, docker_client=client)
    try:
        env.reset(task)
        if fix == {} and task.gold_patch:
            for action in oracle_actions(task, env.repo_dir)[:-1]:
                env.step(action)
        elif fix:
            for path, text in fix.items():
                if text is None:
                    env.backend.exec(["rm", "-f", "--", f"{env.repo_dir}/{path}"], 60)
                else:
                    env.backend.write_file(f"{env.repo_dir}/{path}", text.encode())
        last = env.step(format_action("finish", {"command": "submit"}))
    except EpisodeStartError as exc:
        return {"reward": None, "problem": str(exc)}
    finally:
        env.close()
    grading = env.last_grading or {}
    if "failed" in grading or "sandbox_error" in last.info.extra:
        return {"reward": None, "problem": grading.get("failed") or last.info.extra["sandbox_error"]}
    return {
        "reward": last.reward,
        "graded": grading.get("graded_reward"),
        "flags": grading.get("tamper_flags", []),
        "reading": grading.get("reading", ""),
        "differ": sorted({*last.info.extra.get("tests_mismatched", []), *last.info.extra.get("tests_missing", [])}),
    }


def check_row(config, task: SWETask, absent: dict[str, str], client=None) -> dict:
    """The table row of one sampled task."""
    started = time.monotonic()
    row = {
        "task_id": task.task_id,
        "repository": task.repo_name,
        "image": task.docker_image,
        "image_bytes": None,
        "gold_reward": None,
        "noop_reward": None,
        "reading": "",
        "problems": [],
    }
    if task.docker_image in absent:
        row["problems"].append(f"image absent: {absent[task.docker_image]}")
    else:
        if client is not None:
            try:
                row["image_bytes"] = int(client.images.get(task.docker_image).attrs.get("Size", 0))
            except Exception:  # the size is a courtesy; grading says whether the image works
                pass
        fix = gold_fix(task)
        if fix is None:
            row["problems"].append("no fix in the row (neither parsed_commit_content nor gold_patch)")
        else:
            gold = grade_once(config, task, fix, client)
            row["gold_reward"], row["reading"] = gold["reward"], gold.get("reading", "")
            if gold["reward"] is None:
                row["problems"].append(f"the fix's grading failed: {gold['problem']}")
            elif gold["flags"]:
                row["problems"].append(f"the fix is flagged as tampering: {'; '.join(gold['flags'][:3])}")
            elif gold["reward"] != 1.0:
                row["problems"].append(f"the fix graded 0 (tests that differ: {', '.join(gold['differ'][:5])})")
        noop = grade_once(config, task, None, client)
        row["noop_reward"] = noop["reward"]
        if noop["reward"] is None:
            row["problems"].append(f"no change's grading failed: {noop['problem']}")
        elif max(noop["reward"], noop.get("graded") or 0.0) == 1.0:
            row["problems"].append("no change graded 1: the row cannot tell a fix from none")
    row["problems"] = "; ".join(row["problems"])
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def run(
    tasks_path: str | Path,
    options: dict | None = None,
    rows_per_repository: int = 2,
    workers: int = 4,
    client=None,
) -> list[dict]:
    """The preflight's table (see the module docstring) for a task file and `env.options`."""
    from trainer.environments.suite import family_config

    options = dict(options or {})
    options.pop("tasks_file", None)
    config = family_config("swe", options)
    tasks = load_tasks(tasks_path, kind=config.row_kind)
    chosen = sample(tasks, rows_per_repository)
    absent: dict[str, str] = {}
    if config.backend == "docker":
        from trainer.environments.swe.containers import docker_client
        from trainer.environments.swe.docker_backend import missing_images

        client = client or docker_client(config.docker.start_timeout_s)
        by_task = missing_images(client, tasks, config.docker, workers)  # every image of the file, side by side
        absent = {t.docker_image: by_task[t.task_id] for t in tasks if t.task_id in by_task}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda task: check_row(config, task, absent, client), chosen))


def gold_share(rows: Sequence[dict]) -> float:
    """The share of sampled rows whose own fix was graded 1 (a flagged fix is 0 under `on_tamper: zero`)."""
    return sum(r["gold_reward"] == 1.0 for r in rows) / max(1, len(rows))


def write_table(rows: Sequence[dict], path: str | Path) -> None:
    """The table as TSV, written whole or not at all."""
    lines = ["\t".join(COLUMNS)]
    for row in rows:
        lines.append("\t".join("" if row[c] is None else str(row[c]).replace("\t", " ") for c in COLUMNS))
    with atomic_path(path) as temporary:
        Path(temporary).write_text("\n".join(lines) + "\n")


def markdown(rows: Sequence[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join(
        "| " + " | ".join("" if row[c] is None else str(row[c]).replace("|", "/") for c in COLUMNS) + " |\n"
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.environments.swe.preflight", description=__doc__)
    parser.add_argument("--tasks", help="task file (.jsonl/.parquet); default: the options' tasks_file")
    parser.add_argument("--options", default="{}", help="env.options as JSON (the study's sandbox settings)")
    parser.add_argument("--rows-per-repository", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--min-gold-share", type=float, default=0.9)
    parser.add_argument("--out", default=None, help="write the table here (TSV)")
    args = parser.parse_args(argv)
    try:
        options = json.loads(args.options)
    except json.JSONDecodeError as exc:
        parser.error(f"--options is not JSON: {exc}")
    if not isinstance(options, dict):
        parser.error("--options must be a JSON object (env.options)")
    tasks = args.tasks or options.get("tasks_file")
    if not tasks:
        parser.error("no task file: give --tasks or a tasks_file in --options")
    if args.rows_per_repository < 1 or args.workers < 1 or not 0 <= args.min_gold_share <= 1:
        parser.error("--rows-per-repository and --workers must be >= 1, --min-gold-share in [0, 1]")
    try:
        rows = run(tasks, options, args.rows_per_repository, args.workers)
    except (ValueError, FileNotFoundError) as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write_table(rows, args.out)
    print(markdown(rows))
    share = gold_share(rows)
    verdict = (
        f"{share:.0%} of {len(rows)} sampled rows grade their own fix 1 (min_gold_share {args.min_gold_share:.0%})"
    )
    if share < args.min_gold_share:
        print(f"preflight: FAILED: {verdict}; the study does not start", file=sys.stderr)
        return 1
    print(f"preflight: passed: {verdict}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
