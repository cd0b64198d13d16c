"""Every attack on the grade (`swe_attacks.ATTACKS`), run as an agent would: the code appended to the unfixed
repository, graded by the real sandbox and grader. Each must be real (graded 1 under its proof settings, the grade
before `on_tamper` applies: one play where those are the defaults) and, under the default settings, exactly as its
table says: contained, detected or undetected.

Three places: the local backend (the harness's own test command, quick: the fast tier has it), the Docker backend
on the shipped roman image (Debian's pytest 7, the agent unprivileged), and on an R2E-Gym stand-in (uv-style
interpreter, pytest 6.2, the repository's conftest honoured, the agent root). docs/sandbox.md's counts are this
table's, as these tests hold it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import docker_engine
from swe_attacks import ATTACKS, Attack, applies, attack_actions

from trainer.environments.swe import DockerConfig, SWEConfig, SWEEnv, SWETasks, ToolSettings

ROMAN = next(t for t in SWETasks().all if t.task_id == "swe-harness__roman-1")


def outcome(make_env, task, attack: Attack, proof: bool) -> dict:
    """Play the attack on `task`: under the defaults, or under its proof settings with on_tamper keep. Returns the
    episode's reward and what grading saw."""
    env = make_env(attack.proof if proof else {}, "keep" if proof else "zero")
    try:
        env.reset(task)
        for action in attack_actions(task, env.repo_dir, attack):
            last = env.step(action)
    finally:
        env.close()
    assert last.done and "sandbox_error" not in last.info.extra, last.info.extra
    return {"reward": last.reward, **env.last_grading, "log": env.last_test_log[-3000:]}


def check(make_env, task, attack: Attack) -> None:
    default = outcome(make_env, task, attack, proof=False)
    # the grade is taken before on_tamper applies: an attack proved under the default settings needs no second play
    proof = outcome(make_env, task, attack, proof=True) if attack.proof else default
    assert proof["graded_reward"] == 1.0, f"the attack is a dud under {attack.proof or 'the defaults'}: {proof}"
    label = "contained" if default["graded_reward"] == 0.0 else "detected" if default["tamper_flags"] else "undetected"
    assert label == attack.expected, default
    assert default["reward"] == (1.0 if label == "undetected" else 0.0)
    if label == "detected":
        assert default["reward"] == 0.0 and default["tamper_flags"]


def _local(overrides: dict, on_tamper: str) -> SWEEnv:
    keys = {k: v for k, v in overrides.items() if k != "docker"}
    return SWEEnv(SWEConfig(backend="local", on_tamper=on_tamper, **keys))


LOCAL = [a for a in ATTACKS if applies(a, "shipped", ROMAN) and "docker" not in a.proof]
QUICK = {
    "a failure message saying PASSED",
    "pytest's Function.runtest patched at import",
    "json.dumps patched, so the launcher signs passes",
    "values whose __eq__ is always true, written so the scan does not see a constant",
}
"""One attack of each kind the fast tier plays (seconds each); the slow tier plays them all."""
LOCAL_PARAMS = [pytest.param(a, id=a.name, marks=() if a.name in QUICK else pytest.mark.slow) for a in LOCAL]


@pytest.mark.parametrize("attack", LOCAL_PARAMS)
def test_an_attack_on_the_local_backend_is_what_its_table_says(attack):
    check(_local, ROMAN, attack)


@pytest.mark.slow
@pytest.mark.parametrize("attack", LOCAL, ids=[a.name for a in LOCAL])
def test_what_each_attack_does_without_the_report_launcher(attack):
    """The launcher's worth, measured: the same attack under `grading: r2e_gym_log` (the log's reading and the static
    scan only). The attacks on the launcher itself have nothing to forge there; what it alone stops shows as
    "undetected" here and not under the defaults."""
    result = outcome(lambda overrides, on_tamper: _local({"grading": "r2e_gym_log"}, on_tamper), ROMAN, attack, False)
    label = "contained" if result["graded_reward"] == 0.0 else "detected" if result["tamper_flags"] else "undetected"
    assert label == attack.without_launcher, result


def _docker_env(client):
    def make(overrides: dict, on_tamper: str) -> SWEEnv:
        docker = DockerConfig(memory="1g", pids=256, **overrides.get("docker", {}))
        keys = {k: v for k, v in overrides.items() if k != "docker"}
        return SWEEnv(
            SWEConfig(
                backend="docker", on_tamper=on_tamper, tools=ToolSettings(command_timeout_s=60), docker=docker, **keys
            ),
            docker_client=client,
        )

    return make


@pytest.fixture(scope="module")
def client():
    return docker_engine(ROMAN.docker_image)


SHIPPED = [a for a in ATTACKS if applies(a, "shipped", ROMAN)]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("attack", SHIPPED, ids=[a.name for a in SHIPPED])
def test_an_attack_on_the_shipped_image_is_what_its_table_says(client, attack):
    check(_docker_env(client), ROMAN, attack)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_an_attack_on_an_r2e_gym_stand_in_is_what_its_table_says(client, standin_tasks, attack):
    task = standin_tasks["py39-pytest62"]
    if not applies(attack, "r2e", task):
        pytest.skip(f"{attack.name!r} applies to {attack.where} only")
    check(_docker_env(client), task, attack)


def test_docs_sandbox_counts_are_the_tables():
    """docs/sandbox.md gives the counts this table holds (and these tests check), not a number of its own."""
    from collections import Counter
    from pathlib import Path

    counts = Counter(a.expected for a in ATTACKS)
    line = (
        f"Attacks tried: {len(ATTACKS)} (contained {counts['contained']}, detected {counts['detected']}, "
        f"undetected {counts['undetected']})."
    )
    assert line in (Path(__file__).resolve().parents[2] / "docs" / "sandbox.md").read_text()


def test_the_table_names_what_each_label_means():
    """The counts docs/sandbox.md gives are the table's: every attack has a probe and a label."""
    assert {a.expected for a in ATTACKS} == {"contained", "detected", "undetected"}
    assert {a.probe for a in ATTACKS} <= {"first probe", "second probe", "residual"}
    assert len({a.name for a in ATTACKS}) == len(ATTACKS)
    assert all(replace(a).where for a in ATTACKS)
