"""Episodes in images laid out like R2E-Gym's and like SWE-bench's (as R2E-Gym runs them), built here from the
shipped `roman` task, graded as R2E-Gym grades each kind; and on the R2E-Gym stand-ins (`standins.py`: uv-style
interpreters under /root, pytest 4.6 to 8.3, conftest files that import the package and register its plugin).

* R2E-Gym layout: the repository at /testbed with its own environment at /testbed/.venv, the hidden tests at
  /r2e_tests, R2E-Gym's /testbed/run_tests.sh (`.venv/bin/python -W ignore -m pytest -rA r2e_tests`), no
  unprivileged user (the agent is root, as in R2E-Gym).
* SWE-bench layout: the environment at /opt/miniconda3/envs/testbed, no /r2e_tests, a /run_tests.sh that brings
  the tests itself (as swebench's eval script applies the test patch) and runs them under `set -x`, graded by
  swebench's parser and report on FAIL_TO_PASS / PASS_TO_PASS in swebench's node-id names.

Needs the Docker engine and the base image (`bash .ci/docker-setup.sh`); skips with the reason otherwise, fails
under CI=true.
"""

import hashlib
import io
import os
import re
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from trainer.environments.protocol import EpisodeStartError
from trainer.environments.swe import DockerConfig, SWEConfig, SWEEnv, SWETasks, ToolSettings
from trainer.environments.swe.containers import docker_client
from trainer.environments.swe.image import base_tag
from trainer.environments.swe.oracle import noop_actions, oracle_actions
from trainer.environments.swe.tools import format_action

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROMAN = next(t for t in SWETasks().all if t.task_id == "swe-harness__roman-1")
R2E_RUN_TESTS = ".venv/bin/python -W ignore -m pytest -rA r2e_tests\n"
"""R2E-Gym's run_tests.sh, as its images carry it."""
SWEBENCH_RUN_TESTS = """#!/bin/bash
set -uxo pipefail
cd /testbed
cat > tests/test_hidden.py <<'EOF_114329324912'
{tests}EOF_114329324912
: '>>>>> Start Test Output'
python -m pytest -rA tests/test_hidden.py
: '>>>>> End Test Output'
rm tests/test_hidden.py
"""
"""Shaped like swebench's eval script: the tests come in with the script, every command echoed to stderr."""


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _repo_files(prefix: str = "testbed/") -> dict[str, tuple[bytes, int]]:
    root = Path(ROMAN.repo_path)
    return {
        prefix + p.relative_to(root).as_posix(): (p.read_bytes(), 0o644)
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _build(client, name: str, venv: str, files: dict[str, tuple[bytes, int]]) -> str:
    dockerfile = (
        f"FROM {base_tag()}\nRUN userdel -r agent && mkdir -p {os.path.dirname(venv)} && "
        f"python3 -m venv --without-pip --system-site-packages {venv}\nADD files.tar /\nWORKDIR /testbed\n"
    )
    payload = _tar(files)
    tag = f"swe-harness-test/{name}:{hashlib.sha256(dockerfile.encode() + payload).hexdigest()[:12]}"
    try:
        client.images.get(tag)
    except Exception:
        context = _tar({"Dockerfile": (dockerfile.encode(), 0o644), "files.tar": (payload, 0o644)})
        client.images.build(
            fileobj=io.BytesIO(context),
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            network_mode="none",
            pull=False,
        )
    return tag


@pytest.fixture(scope="module")
def images():
    try:
        client = docker_client(timeout=300)
        client.images.get(base_tag())
    except Exception as exc:
        message = f"{exc} (run `bash .ci/docker-setup.sh` as root to start Docker and build the base image)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so the docker tests must run, but: {message}")
        pytest.skip(message)
    hidden = {f"r2e_tests/{p.name}": (p.read_bytes(), 0o644) for p in Path(ROMAN.hidden_tests_path).glob("*.py")}
    r2e = _build(
        client,
        "r2e-layout",
        "/testbed/.venv",
        {**_repo_files(), **hidden, "testbed/run_tests.sh": (R2E_RUN_TESTS.encode(), 0o755)},
    )
    tests = (Path(ROMAN.hidden_tests_path) / "test_roman.py").read_text()
    swebench = _build(
        client,
        "swebench-layout",
        "/opt/miniconda3/envs/testbed",
        {**_repo_files(), "run_tests.sh": (SWEBENCH_RUN_TESTS.format(tests=tests).encode(), 0o755)},
    )
    r2e_task = replace(ROMAN, task_id="r2e-layout-roman", docker_image=r2e)
    swebench_task = replace(
        ROMAN,
        task_id="swebench-layout-roman",
        docker_image=swebench,
        kind="swebench",
        repo_name="pytest-dev/pytest",
        version="8.0",
        expected={},
        fail_to_pass=tuple(f"tests/test_hidden.py::{t}" for t in ROMAN.fail_to_pass),
        pass_to_pass=tuple(f"tests/test_hidden.py::{t}" for t in ROMAN.pass_to_pass),
    )
    return client, {"r2e": r2e_task, "swebench": swebench_task}


def _env(client, **docker):
    return SWEEnv(
        SWEConfig(
            backend="docker", tools=ToolSettings(command_timeout_s=60), docker=DockerConfig(memory="1g", **docker)
        ),
        docker_client=client,
    )


def _bash(env, cmd: str) -> str:
    return env.step(format_action("execute_bash", {"cmd": cmd})).observation


@pytest.mark.parametrize("kind, venv", [("r2e", "/testbed/.venv"), ("swebench", "/opt/miniconda3/envs/testbed")])
def test_the_agents_python_is_the_repositorys(images, kind, venv):
    """R2E-Gym's setup: the environment linked to /root/.venv, its executables in /root/.local/bin, first on PATH;
    the agent is root (these images have no other user); the test script is out of /testbed and /."""
    client, tasks = images
    env = _env(client)
    env.reset(tasks[kind])
    try:
        assert "uid=0" in _bash(env, "echo uid=$(id -u)")
        assert venv in _bash(env, 'python -c "import os, sys; print(os.path.realpath(sys.prefix))"')
        assert f"-> {venv}" in _bash(env, "ls -l /root/.venv")
        assert "/root/.venv/bin/python" in _bash(env, "command -v python")
        assert f"{venv}/bin/python" in _bash(env, "readlink /root/.local/bin/python")
        assert "pytest" in _bash(env, "python -m pytest --version")
        assert "No such file" in _bash(env, "ls /testbed/run_tests.sh")
        assert "run_tests.sh" in _bash(env, "ls /root")
    finally:
        env.close()


@pytest.mark.parametrize("kind", ["r2e", "swebench"])
@pytest.mark.parametrize("grade_in", ["fresh", "episode"])
def test_the_gold_patch_gets_1_and_no_change_gets_0(images, kind, grade_in):
    client, tasks = images
    task = tasks[kind]
    rewards = []
    for actions in (oracle_actions(task, "/testbed"), noop_actions()):
        env = _env(client, grade_in=grade_in)
        env.reset(task)
        results = [env.step(action) for action in actions]
        env.close()
        assert results[-1].done
        rewards.append(results[-1].reward)
        if kind == "swebench":
            assert env.last_grade.parsed, env.last_test_log[-2000:]
    assert rewards == [1.0, 0.0], env.last_test_log[-2000:]
    if kind == "swebench":  # graded by name: the unfixed repository fails exactly the FAIL_TO_PASS tests
        assert sorted(env.last_grade.mismatched) == sorted(task.fail_to_pass)
    else:
        assert env.last_grade.mismatched.keys() == set(task.fail_to_pass)


def test_an_r2e_row_in_an_image_without_hidden_tests_is_a_clear_error(images):
    client, tasks = images
    env = _env(client)
    with pytest.raises(EpisodeStartError, match="image has no /r2e_tests"):
        env.reset(replace(tasks["r2e"], docker_image=tasks["swebench"].docker_image))


def _task_file(tmp_path, ghost: bool) -> Path:
    """The shipped tasks without their local fixtures (the docker backend needs only the images), plus a task whose
    image exists nowhere."""
    import json

    rows = [json.loads(line) for line in (Path(ROMAN.repo_path).parents[1] / "tasks.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("repo_path"), row.pop("hidden_tests_path")
    if ghost:
        rows.append({**rows[0], "task_id": "ghost", "docker_image": "swe-harness/does-not-exist:latest"})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("policy", ["never", "missing"])
def test_the_pull_command_lists_the_tasks_whose_image_is_absent(images, tmp_path, policy):
    import subprocess
    import sys

    absent = tmp_path / "absent.tsv"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.environments.swe.pull",
            "--tasks",
            str(_task_file(tmp_path, ghost=True)),
            "--pull",
            policy,
            "--absent",
            str(absent),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr
    lines = absent.read_text().splitlines()
    assert [line.split("\t")[:2] for line in lines] == [["ghost", "swe-harness/does-not-exist:latest"]]
    assert ("docker.pull is 'never'" if policy == "never" else "pulling it failed") in lines[0]
    assert "6 of 7 tasks have their image; 1 absent" in run.stderr
    complete = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.environments.swe.pull",
            "--tasks",
            str(_task_file(tmp_path, ghost=False)),
            "--pull",
            "never",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert complete.returncode == 0 and complete.stdout == "", complete.stderr


def test_a_cell_leaves_out_a_task_whose_image_is_absent(images, tmp_path, capfd):
    from trainer.config import EnvConfig
    from trainer.environments.suite import make_suite

    suite = make_suite(
        EnvConfig(
            name="swe",
            options={
                "tasks_file": str(_task_file(tmp_path, ghost=True)),
                "backend": "docker",
                "docker": {"pull": "never"},
            },
        )
    )
    assert "ghost" not in {t.task_id for t in suite.tasks.tasks("train")}
    assert len(suite.tasks.tasks("train")) == 4 and list(suite.tasks.skipped) == ["ghost"]
    assert (
        "[swe] task 'ghost' left out: image 'swe-harness/does-not-exist:latest' is not present"
        in capfd.readouterr().err
    )


# --------------------------------------------------------------------------------------------------------------
# R2E-Gym stand-ins: uv-style interpreters under /root, /testbed/.venv, the repository's conftest honoured
# --------------------------------------------------------------------------------------------------------------


def _paper_options() -> dict:
    """configs/paper.yaml's env.options, as the paper study's cells get them."""
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "paper.yaml").read_text())
    options = dict(config["cell"]["env"]["options"])
    options.pop("tasks_file")
    return options


def _graded(client, task, config: SWEConfig, fix: bool) -> dict:
    """Play the row's gold fix (rebuilt from its parsed commit) or no change; the reward and what grading saw."""
    from trainer.environments.swe.tasks import commit_fix

    env = SWEEnv(config, docker_client=client)
    try:
        env.reset(task)
        if fix:
            for path, text in commit_fix(task.extra["parsed_commit_content"]).items():
                env.backend.write_file(f"/testbed/{path}", text.encode())
        last = env.step(format_action("finish", {"command": "submit"}))
    finally:
        env.close()
    assert last.done and "sandbox_error" not in last.info.extra, last.info.extra
    return {"reward": last.reward, **env.last_grading, "log": env.last_test_log[-2000:]}


STANDIN_SETTINGS = {
    "defaults": lambda: SWEConfig(backend="docker"),
    "paper": lambda: family_config_swe(_paper_options()),
    "layer": lambda: SWEConfig(backend="docker", docker=DockerConfig(scratch=False)),
}


def family_config_swe(options: dict) -> SWEConfig:
    from trainer.environments.suite import family_config

    return family_config("swe", options)


@pytest.mark.parametrize("settings", ["defaults", "paper"])
@pytest.mark.parametrize(
    "layout",
    ["py37-pytest46", "py38-pytest54", "py39-pytest62", "py311-pytest74", "py311-pytest83-large", "py311-unittest"],
)
def test_a_correct_fix_gets_1_and_no_change_0_on_every_r2e_gym_stand_in(images, standin_tasks, layout, settings):
    """Under the default sandbox settings and configs/paper.yaml's: the repository's conftest that imports the
    package and registers its plugin honoured, no flag on an honest fix; the unittest row read from its log."""
    client, _ = images
    task = standin_tasks[layout]
    gold = _graded(client, task, STANDIN_SETTINGS[settings](), fix=True)
    assert (gold["reward"], gold["tamper_flags"]) == (1.0, []), gold
    noop = _graded(client, task, STANDIN_SETTINGS[settings](), fix=False)
    assert noop["reward"] == 0.0 and noop["graded_reward"] == 0.0, noop
    reading = "log" if layout == "py311-unittest" else "report"
    assert gold["reading"].startswith(reading) and noop["reading"].startswith(reading)


def test_a_stand_in_grades_in_the_images_writable_layer_too(images, standin_tasks):
    client, _ = images
    task = standin_tasks["py311-pytest83-large"]
    assert _graded(client, task, STANDIN_SETTINGS["layer"](), fix=True)["reward"] == 1.0
    assert _graded(client, task, STANDIN_SETTINGS["layer"](), fix=False)["reward"] == 0.0


def test_scratch_places_hold_the_images_interpreters_and_repository(images, standin_tasks):
    """The stand-in's interpreter lives under /root and its venv in /testbed: both are scratch places, filled from
    the image and sized to its content plus the room, and mounted executable."""
    from trainer.environments.swe.docker_backend import place_sizes

    client, _ = images
    task = standin_tasks["py311-pytest83-large"]
    sizes = place_sizes(client, task.docker_image)
    assert sizes["/testbed"][0] > 80 * 1024**2 and sizes["/root"][0] > 20 * 1024**2
    env = SWEEnv(SWEConfig(backend="docker"), docker_client=client)
    env.reset(task)
    try:
        assert "Python 3.11" in _bash(env, "/testbed/.venv/bin/python --version")
        assert "/root/.local/share/uv/python/cpython-3.11" in _bash(env, "readlink -f /testbed/.venv/bin/python")
        room = DockerConfig().scratch_bytes
        free = int(re.search(r"\[STDOUT\]\s+(\d+)", _bash(env, "df -B1 --output=avail /testbed | tail -1")).group(1))
        assert room * 0.9 < free <= room * 1.1
    finally:
        env.close()


def test_a_root_command_stopped_by_the_host_leaves_the_scratch_places_as_they_were(images, standin_tasks):
    """R2E-Gym's images run the agent as root: a command the host must stop (here its output floods) is stopped
    by killing every process but the container's own two, not by restarting the container, which would empty the
    scratch places and lose the agent's work."""
    client, _ = images
    env = SWEEnv(
        SWEConfig(
            backend="docker", tools=ToolSettings(command_timeout_s=30), docker=DockerConfig(max_output_bytes=2**20)
        ),
        docker_client=client,
    )
    env.reset(standin_tasks["py39-pytest62"])
    try:
        main = env.backend.main_pid
        _bash(env, "echo work > /testbed/mine.txt")
        flood = env.step(format_action("execute_bash", {"cmd": "setsid sleep 300 & yes"}))
        assert not flood.done
        after = _bash(
            env, "cat /testbed/mine.txt; ls /testbed/.venv/bin/python; for p in /proc/[0-9]*; do cat $p/comm; done"
        )
        assert "work" in after and "/testbed/.venv/bin/python" in after, after
        assert after.count("sleep") == 1 and env.backend.main_pid == main  # the daemon is gone, no restart
    finally:
        env.close()
