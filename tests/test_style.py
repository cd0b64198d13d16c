"""The tree is held to its linters' and formatters' output (settings in pyproject.toml: ruff's rules and line
length, snakefmt's): `ruff check`, `ruff format --check` and `snakefmt --check` must report nothing. To fix a
failure: `.venv/bin/ruff check --fix . && .venv/bin/ruff format . && .venv/bin/snakefmt Snakefile workflow/rules`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
    exe = BIN / cmd[0]
    if not exe.exists():
        pytest.fail(f"{cmd[0]} is not installed beside {sys.executable}: pip install -e '.[test]'")
    return subprocess.run([str(exe), *cmd[1:]], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(
    "cmd",
    [
        ("ruff", "check", "."),
        ("ruff", "format", "--check", "."),
        ("snakefmt", "--check", "Snakefile", "workflow/rules"),
    ],
    ids=["ruff-check", "ruff-format", "snakefmt"],
)
def test_the_tree_is_linted_and_formatted(cmd):
    run = _run(*cmd)
    assert run.returncode == 0, f"{' '.join(cmd)} found something:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
