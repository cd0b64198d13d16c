"""The two kinds of swe rows (R2E-Gym's and SWE-bench's), graded as R2E-Gym grades each; absent images left out.

SWE-bench rows are graded by swebench 3.0.2 (the release R2E-Gym pins) the way R2E-Gym's
`_calculate_reward_swebench` calls it. The expected statuses and rewards below are worked out by hand from those
rules: a status line is one that starts with PASSED / FAILED / SKIPPED / ERROR / XFAIL, its key the second
whitespace-separated word (" - " removed from FAILED lines first); only the log after the last echo of the test
command counts; a failure marker (">>>>> Tests Errored", ...) voids the log; a FAIL_TO_PASS or PASS_TO_PASS test
succeeds when PASSED or XFAIL, fails when FAILED, ERROR or absent, and a skipped one counts neither way; the reward
is 1 only when every counted test succeeded.
"""

import json

import pytest

from trainer.environments.suite import family_config
from trainer.environments.swe.docker_backend import DockerConfig, missing_images
from trainer.environments.swe.env import SWEConfig, SWEEnv
from trainer.environments.swe.grading import grade_swebench, parse_swebench_log, swebench_test_command
from trainer.environments.swe.tasks import SWETasks, load_tasks, row_kind, task_from_record

R2E_ROW = {
    "repo_name": "tornado",
    "docker_image": "namanjain12/tornado_final:abc",
    "problem_statement": "[ISSUE]x[/ISSUE]",
    "expected_output_json": json.dumps({"HTTPHeadersTest.test_copy": "PASSED"}),
}
SWEBENCH_ROW = {
    "instance_id": "pytest-dev__pytest-5103",
    "repo": "pytest-dev/pytest",
    "version": "8.0",
    "docker_image": "namanjain12/swebench_pytest:5103",
    "problem_statement": "assert all(...)",
    "FAIL_TO_PASS": json.dumps(["testing/test_x.py::test_fixed"]),
    "PASS_TO_PASS": json.dumps(["testing/test_x.py::TestOld::test_kept[1-2]"]),
}

# /run_tests.sh output of a SWE-bench image (stdout and stderr interleaved; `set -x` echoes each command).
LOG = """+ git checkout 10ca84ffc testing/test_x.py
Updated 0 paths from 2a4c1d3
+ git apply -v -
Checking patch testing/test_x.py...
PASSED testing/test_x.py::test_broken
+ pytest -rA testing/test_x.py
============================= test session starts ==============================
collected 6 items

testing/test_x.py .F.sxE                                                 [100%]
=========================== short test summary info ============================
PASSED testing/test_x.py::test_fixed
PASSED testing/test_x.py::TestOld::test_kept[1-2]
FAILED testing/test_x.py::test_broken - AssertionError: assert 1 == 2
SKIPPED [1] testing/test_x.py:30: needs numpy
XFAIL testing/test_x.py::test_known - reason: flaky
ERROR testing/test_x.py::test_setup - fixture 'db' not found
============= 1 failed, 2 passed, 1 skipped, 1 xfailed, 1 error in 0.12s =============
+ git checkout 10ca84ffc testing/test_x.py
"""
PARSED = {
    "testing/test_x.py::test_fixed": "PASSED",
    "testing/test_x.py::TestOld::test_kept[1-2]": "PASSED",
    "testing/test_x.py::test_broken": "FAILED",
    "[1]": "SKIPPED",
    "testing/test_x.py::test_known": "XFAIL",
    "testing/test_x.py::test_setup": "ERROR",
}
"""By hand: the PASSED line printed before `+ pytest -rA` is cut away; the skip's key is its second word."""

DJANGO_LOG = """+ ./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 forms_tests.tests
test_clean (forms_tests.tests.FormsTests) ... ok
test_render (forms_tests.tests.FormsTests) ... FAIL
test_slow (forms_tests.tests.FormsTests) ... skipped 'slow'
test_broken (forms_tests.tests.FormsTests) ... ERROR
"""


def test_the_row_kind_comes_from_the_fields():
    assert row_kind(R2E_ROW) == "r2e"
    assert row_kind(SWEBENCH_ROW) == "swebench"
    assert row_kind({**SWEBENCH_ROW, "expected_output_json": R2E_ROW["expected_output_json"]}) == "r2e"
    with pytest.raises(ValueError, match="neither an R2E-Gym row .*'expected_output_json'.*'FAIL_TO_PASS'"):
        row_kind({"docker_image": "x", "problem_statement": "p", "FAIL_TO_PASS": "[]"}, "rows.jsonl entry 3")


def test_a_swebench_row_loads_with_its_lists_and_version():
    task = task_from_record(SWEBENCH_ROW)
    assert (task.kind, task.task_id, task.repo_name, task.version) == (
        "swebench",
        "pytest-dev__pytest-5103",
        "pytest-dev/pytest",
        "8.0",
    )
    assert task.fail_to_pass == ("testing/test_x.py::test_fixed",)
    assert task.pass_to_pass == ("testing/test_x.py::TestOld::test_kept[1-2]",)
    assert task.expected == {}
    as_lists = task_from_record({**SWEBENCH_ROW, "FAIL_TO_PASS": ["a::b"], "PASS_TO_PASS": []})
    assert (as_lists.fail_to_pass, as_lists.pass_to_pass) == (("a::b",), ())


@pytest.mark.parametrize(
    "change, message",
    [
        ({"repo": "someone/unknown"}, "field 'repo' is 'someone/unknown', which swebench has no log parser for"),
        ({"version": "0.1"}, "field 'version' is '0.1', not a version swebench knows for pytest-dev/pytest"),
        ({"version": None}, "missing field 'version'"),
        ({"repo": None}, "missing field 'repo'"),
        ({"FAIL_TO_PASS": "[not json"}, "field 'FAIL_TO_PASS' must be a list of strings"),
        ({"PASS_TO_PASS": json.dumps([1, 2])}, "field 'PASS_TO_PASS' must be a list of strings"),
        ({"FAIL_TO_PASS": "[]"}, "field 'FAIL_TO_PASS' is empty"),
    ],
)
def test_a_bad_swebench_row_is_refused_naming_the_field(change, message):
    row = {k: v for k, v in {**SWEBENCH_ROW, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=f"entry 0 \\(pytest-dev__pytest-5103\\): .*{message[:40]}"):
        task_from_record(row, where="rows.jsonl entry 0")


def test_a_named_kind_overrides_the_fields(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(SWEBENCH_ROW) + "\n")
    with pytest.raises(ValueError, match="rows.jsonl entry 0 .*'expected_output_json'"):
        load_tasks(path, kind="r2e")
    assert load_tasks(path, kind="swebench")[0].kind == "swebench"
    with pytest.raises(ValueError, match="row kind 'svn' is not one of"):
        load_tasks(path, kind="svn")
    with pytest.raises(ValueError, match="env.options.row_kind.*one of"):
        family_config("swe", {"row_kind": "svn"})


def test_the_swebench_log_is_cut_at_the_test_command_and_parsed_as_swebench_does():
    assert swebench_test_command("pytest-dev/pytest", "8.0") == "pytest -rA"
    assert parse_swebench_log(LOG, "pytest-dev/pytest", "8.0") == PARSED
    voided = LOG.replace("+ git checkout 10ca84ffc testing/test_x.py\n", ">>>>> Tests Errored\n", 1)
    assert parse_swebench_log(voided, "pytest-dev/pytest", "8.0") == {}
    django = parse_swebench_log(DJANGO_LOG, "django/django", "4.0")
    assert django == {
        "test_clean (forms_tests.tests.FormsTests)": "PASSED",
        "test_render (forms_tests.tests.FormsTests)": "FAILED",
        "test_slow (forms_tests.tests.FormsTests)": "SKIPPED",
        "test_broken (forms_tests.tests.FormsTests)": "ERROR",
    }


@pytest.mark.parametrize(
    "f2p, p2p, reward",
    [
        (["testing/test_x.py::test_fixed"], ["testing/test_x.py::TestOld::test_kept[1-2]"], 1.0),
        (["testing/test_x.py::test_fixed"], ["testing/test_x.py::test_known"], 1.0),  # XFAIL counts as passing
        (["testing/test_x.py::test_fixed", "testing/test_x.py::test_broken"], [], 0.0),  # FAILED
        (["testing/test_x.py::test_fixed"], ["testing/test_x.py::test_setup"], 0.0),  # ERROR
        (["testing/test_x.py::test_fixed"], ["testing/test_x.py::test_gone"], 0.0),  # absent from the log
        (["[1]"], [], 1.0),  # a skipped F2P test counts neither way: 0 of 0 counted (swebench 3.0.2, as R2E-Gym has it)
    ],
)
def test_the_swebench_reward_by_hand(f2p, p2p, reward):
    got = grade_swebench(PARSED, "pytest-dev/pytest", f2p, p2p)
    assert got.reward == reward
    failing = {t for t in f2p + p2p if PARSED.get(t) in ("FAILED", "ERROR")}
    assert set(got.mismatched) == failing
    assert set(got.missing) == {t for t in f2p + p2p if t not in PARSED}


def test_the_django_reward_by_hand():
    parsed = parse_swebench_log(DJANGO_LOG, "django/django", "4.0")
    assert (
        grade_swebench(
            parsed,
            "django/django",
            ["test_clean (forms_tests.tests.FormsTests)"],
            ["test_slow (forms_tests.tests.FormsTests)"],
        ).reward
        == 1.0
    )
    assert grade_swebench(parsed, "django/django", ["test_render (forms_tests.tests.FormsTests)"], []).reward == 0.0


def test_a_swebench_row_needs_the_docker_backend():
    env = SWEEnv(SWEConfig(backend="local"))
    with pytest.raises(ValueError, match="SWE-bench row.*backend: docker"):
        env.reset(task_from_record(SWEBENCH_ROW))


class _Images:
    """A docker client whose engine has the images in `present`; pulls fail like an unreachable registry."""

    def __init__(self, present):
        import docker

        self.present, self.errors, self.pulls = set(present), docker.errors, []
        self.images, self.api = self, self

    def get(self, name):
        if name not in self.present:
            raise self.errors.ImageNotFound(name)

    def pull(self, repository, tag, stream, decode):
        self.pulls.append(f"{repository}:{tag}")
        yield {"status": "Pulling from " + repository}
        yield {"error": "Get https://registry-1.docker.io/v2/: no such host"}


def test_tasks_whose_image_cannot_be_had_are_left_out():
    tasks = SWETasks()
    present = {t.docker_image for t in tasks.all[1:]}
    for policy, pulls in (("never", []), ("missing", [tasks.all[0].docker_image])):
        client = _Images(present)
        absent = missing_images(client, tasks.all, DockerConfig(pull=policy))
        assert list(absent) == [tasks.all[0].task_id]
        assert ("docker.pull is 'never'" if policy == "never" else "no such host") in absent[tasks.all[0].task_id]
        assert client.pulls == pulls
    first = tasks.all[0].task_id
    tasks.keep(absent)
    assert first not in {t.task_id for t in list(tasks.tasks("train")) + list(tasks.tasks("heldout"))}
    assert len(tasks.all) == len(SWETasks().all) - 1 and list(tasks.skipped) == [first]
    heldout = tasks.tasks("heldout")[0]
    tasks.keep({f"{heldout.task_id}-impossible": "absent"})
    assert f"{heldout.task_id}-impossible" not in {t.task_id for t in tasks.impossible(2)}


def test_an_episode_out_of_time_ends_and_is_graded():
    """`max_episode_s` (R2E-Gym's trajectory time limit) ends the episode after the call that passes it, and the
    repository is graded as it stands: the gold patch, then a slow command, gets 1."""
    from trainer.environments.swe.oracle import patch_actions
    from trainer.environments.swe.tools import format_action

    task = SWETasks().all[0]
    env = SWEEnv(SWEConfig(backend="local", max_episode_s=1.0))
    env.reset(task)
    results = [env.step(a) for a in patch_actions(task.gold_patch, env.repo_dir, check_command=None)[:-1]]
    assert not any(r.done for r in results)
    last = env.step(format_action("execute_bash", {"cmd": "sleep 1.2"}))
    assert last.done and last.info.extra["time_limit"] and not last.info.extra["turn_limit"]
    assert last.reward == 1.0 and env.elapsed_s >= 1.0
    with pytest.raises(ValueError, match="max_episode_s must be positive"):
        SWEConfig(max_episode_s=0)


def test_the_countdown_follows_r2e_gyms_agent_loop():
    """R2E-Gym appends "Steps Remaining: N" (N = max_steps - steps taken) to the instruction and to each observation,
    then its "submit NOW" line at 0; here max_turns is its absolute limit and countdown_steps its max_steps."""
    from trainer.environments.swe.tools import format_action

    look = format_action("execute_bash", {"cmd": "true"})
    env = SWEEnv(SWEConfig(backend="local", max_turns=3, countdown_steps=2))
    assert env.reset(SWETasks().all[0]).endswith("You have at most 3 turns.\nSteps Remaining: 2")
    assert env.step(look).observation.endswith(" \n\n[STDERR]\n\n\n\nSteps Remaining: 1")
    assert env.step(look).observation.endswith(
        "\n\nYou have reached the maximum number of steps. Please submit your answer NOW."
    )
    last = env.step(look)
    assert last.done and last.observation.endswith("[STDERR]\n\n\n")
    quiet = SWEEnv(SWEConfig(backend="local", steps_remaining=False))
    assert quiet.reset(SWETasks().all[0]).endswith("turns.")
    assert quiet.step(look).observation.endswith("[STDERR]\n\n\n")
    quiet.close()
