"""Scripted agents that act only through the real tools: the oracle, the no-op agent, a patch replayer.

The oracle turns a task's gold patch (a unified diff) into `file_editor str_replace` calls, one per hunk:
a hunk's context and removed lines are the `old_str`, its context and added lines the `new_str`. It then runs
the repository's visible tests with `execute_bash` and calls `finish`. Replaying `p2p_breaking_patch` the same
way gives the "fixes the bug but breaks a pass-to-pass test" agent; `noop_actions` just finishes.
The patches never enter a sandbox: the agent's text does.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from trainer.environments.swe.tools import format_action

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True)
class Edit:
    """Replace `old` by `new` in the file at `path` (relative to the repository root)."""

    path: str
    old: str
    new: str


def patch_edits(patch: str) -> list[Edit]:
    """One Edit per hunk of a unified diff; raises ValueError on text that is not a diff."""
    edits: list[Edit] = []
    path = None
    old: list[str] | None = None
    new: list[str] = []

    def flush() -> None:
        if old is not None:
            edits.append(Edit(path, "".join(old), "".join(new)))

    for number, line in enumerate(patch.splitlines(keepends=True), start=1):
        if line.startswith("--- "):
            flush()
            old = None
        elif line.startswith("+++ "):
            target = line[4:].strip().split("\t")[0]
            if target == "/dev/null":
                raise ValueError(f"patch line {number}: file deletions are not supported")
            path = target[2:] if target.startswith("b/") else target
        elif _HUNK.match(line):
            if path is None:
                raise ValueError(f"patch line {number}: hunk before any '+++' header")
            flush()
            old, new = [], []
        elif old is not None and line in ("\n", "\r\n"):
            old.append(line)  # an empty context line whose leading space was lost
            new.append(line)
        elif old is not None and line[:1] in (" ", "-", "+"):
            if line[0] in " -":
                old.append(line[1:])
            if line[0] in " +":
                new.append(line[1:])
        elif old is not None and line.startswith("\\"):
            continue  # "\ No newline at end of file"
        elif line.strip():
            raise ValueError(f"patch line {number}: unexpected text {line.rstrip()!r}")
    flush()
    if not edits:
        raise ValueError("the patch has no hunks")
    return edits


def patch_actions(patch: str, repo_dir: str, check_command: str | None = "python3 -m pytest -q tests") -> list[str]:
    """Actions applying `patch` with str_replace, then (optionally) running `check_command`, then finishing."""
    actions = [
        format_action(
            "file_editor",
            {
                "command": "str_replace",
                "path": posixpath.join(repo_dir, edit.path),
                "old_str": edit.old,
                "new_str": edit.new,
            },
        )
        for edit in patch_edits(patch)
    ]
    if check_command:
        actions.append(format_action("execute_bash", {"cmd": check_command}))
    actions.append(format_action("finish", {"command": "submit"}))
    return actions


def oracle_actions(task, repo_dir: str) -> list[str]:
    """The oracle: the task's gold patch through the tools, a test run, finish."""
    if not task.gold_patch:
        raise ValueError(f"task {task.task_id!r} has no gold_patch")
    return patch_actions(task.gold_patch, repo_dir)


def noop_actions() -> list[str]:
    """Submit the repository unchanged."""
    return [format_action("finish", {"command": "submit"})]
