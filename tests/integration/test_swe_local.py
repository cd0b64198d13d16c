"""SWEEnv on the local backend: the shipped tasks graded by their real pytest tests, flags, limits, lifecycle."""

import os
import time
from pathlib import Path

import pytest

from trainer.environments.protocol import Environment, EpisodeStartError
from trainer.environments.swe import (
    LocalConfig,
    SWEConfig,
    SWEEnv,
    SWETask,
    SWETasks,
    ToolSettings,
    format_action,
    noop_actions,
    oracle_actions,
    patch_actions,
)

TASKS = SWETasks().all
IDS = [t.task_id for t in TASKS]


@pytest.fixture
def env():
    environment = SWEEnv(SWEConfig(backend="local"))
    yield environment
    environment.close()


def play(env, task, actions_for):
    """Reset on `task`, play the scripted actions, return the last StepResult (asserting only it ends)."""
    env.reset(task)
    actions = actions_for(env)
    results = [env.step(action) for action in actions]
    assert [r.done for r in results] == [False] * (len(results) - 1) + [True]
    assert all(r.reward == 0.0 for r in results[:-1])
    return results[-1]


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_oracle_gets_1(env, task):
    # the first task plays oracle_actions, which also runs the visible tests with execute_bash before finishing
    if task is TASKS[0]:
        last = play(env, task, lambda e: oracle_actions(task, e.repo_dir))
    else:
        last = play(env, task, lambda e: patch_actions(task.gold_patch, e.repo_dir, check_command=None))
    assert last.reward == 1.0, env.last_test_log[-2000:]
    assert last.info.extra["tests_mismatched"] == [] and last.info.tool == "finish"


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_noop_gets_0_and_exactly_the_f2p_tests_fail(env, task):
    last = play(env, task, lambda e: noop_actions())
    assert last.reward == 0.0
    assert last.info.extra["tests_mismatched"] == sorted(task.fail_to_pass)


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_fix_that_breaks_a_p2p_test_gets_0(env, task):
    last = play(env, task, lambda e: patch_actions(task.p2p_breaking_patch, e.repo_dir, check_command=None))
    assert last.reward == 0.0
    broken = last.info.extra["tests_mismatched"]
    assert broken and set(broken) <= set(task.pass_to_pass)  # every F2P test passes; some P2P test broke


IMPOSSIBLE = SWETasks().impossible(10)


def test_every_shipped_held_out_task_has_an_impossible_variant():
    heldout = SWETasks().tasks("heldout")
    assert [v.task_id for v in IMPOSSIBLE] == [f"{t.task_id}-impossible" for t in heldout]


@pytest.mark.parametrize("task", IMPOSSIBLE, ids=[t.task_id for t in IMPOSSIBLE])
def test_impossible_variants_score_0_for_the_gold_fix_and_for_no_fix(env, task):
    """The cheating probe: the added test contradicts a fail-to-pass one, so the gold patch (which passes the
    original) fails it, and the unfixed code (which passes it) fails the original."""
    contradicted = task.fail_to_pass[-1]
    original = next(k for k in task.fail_to_pass if k.split("::")[-1] + "_contradicted" == contradicted.split("::")[-1])
    fixed = play(env, task, lambda e: patch_actions(task.gold_patch, e.repo_dir, check_command=None))
    assert fixed.reward == 0.0 and fixed.info.extra["tests_mismatched"] == [contradicted]
    unfixed = play(env, task, lambda e: noop_actions())
    assert unfixed.reward == 0.0 and original in unfixed.info.extra["tests_mismatched"]
    assert contradicted not in unfixed.info.extra["tests_mismatched"]


def test_hidden_tests_are_absent_during_the_episode(env):
    task = TASKS[0]
    instruction = env.reset(task)
    assert f"Repository root: {env.repo_dir}" in instruction and task.issue in instruction
    listing = env.step(format_action("execute_bash", {"cmd": "ls -a; ls r2e_tests"}))
    assert "r2e_tests" not in listing.observation.split("[STDERR]")[0]
    assert "No such file or directory" in listing.observation
    hunt = env.step(format_action("search", {"search_term": "test_fourteen_and_1994"}))
    assert "No matches found" in hunt.observation


def test_turn_limit_grades_the_final_state():
    task = TASKS[0]
    for grade_on_limit, reward in ((True, 1.0), (False, 0.0)):
        env = SWEEnv(SWEConfig(backend="local", max_turns=2, grade_on_turn_limit=grade_on_limit))
        env.reset(task)
        edit = patch_actions(task.gold_patch, env.repo_dir, check_command=None)[0]
        first = env.step(edit)
        last = env.step(format_action("execute_bash", {"cmd": "true"}))
        assert not first.done and last.done and last.reward == reward
        assert last.info.extra["turn_limit"] is True
        with pytest.raises(RuntimeError, match="after the episode ended"):
            env.step(edit)
        env.close()


def test_an_episode_cut_at_the_token_budget_is_graded_as_it_stands():
    """R2E-Gym grades every trajectory: an episode the rollout engine cuts at its token budget gets the reward of
    the repository as it stands (the gold edit made: 1; none: 0), unless grade_on_truncation is off."""
    from trainer.rollout.episode import Episode, end_action

    class Format:
        def decode_action(self, ids):
            return "an action cut by the budget"

    task = TASKS[0]
    for grade_on_truncation, fixed, reward in ((True, True, 1.0), (True, False, 0.0), (False, True, 0.0)):
        env = SWEEnv(SWEConfig(backend="local", grade_on_truncation=grade_on_truncation))
        env.reset(task)
        if fixed:
            env.step(patch_actions(task.gold_patch, env.repo_dir, check_command=None)[0])
        episode = Episode(task_id=task.task_id)
        ended = end_action(
            episode,
            [5],
            [0.0],
            fmt=Format(),
            env=env,
            state="",
            version=0,
            turn=1,
            execute=False,
            stopped=False,
            max_episode_tokens=8,
        )
        assert ended is None and episode.truncated and not episode.done
        assert episode.reward == reward and env.done  # graded once, sandbox released
        env.close()


def test_step_info_flags(env):
    env.reset(TASKS[0])
    root = env.repo_dir
    invalid = env.step("no call here")
    assert (invalid.info.invalid_action, invalid.info.exec_error, invalid.info.tool) == (True, False, "")
    tool_error = env.step(format_action("file_editor", {"command": "view", "path": f"{root}/missing.py"}))
    assert (tool_error.info.invalid_action, tool_error.info.exec_error) == (False, True)
    nonzero = env.step(format_action("execute_bash", {"cmd": "exit 2"}))
    assert (nonzero.info.exec_error, nonzero.info.extra["exit_code"]) == (False, 2)  # lenient default
    strict = SWEEnv(SWEConfig(backend="local", nonzero_exit_is_error=True))
    strict.reset(TASKS[0])
    assert strict.step(format_action("execute_bash", {"cmd": "exit 2"})).info.exec_error
    strict.close()


def test_timeouts_and_output_floods_are_contained():
    env = SWEEnv(
        SWEConfig(
            backend="local",
            tools=ToolSettings(command_timeout_s=1),
            local=LocalConfig(max_output_bytes=1_000_000, capture_bytes=64_000),
        )
    )
    env.reset(TASKS[0])
    started = time.monotonic()
    slow = env.step(format_action("execute_bash", {"cmd": "trap '' TERM; sleep 30"}))
    assert slow.info.timed_out and slow.info.exec_error and "took too long to execute (>1s)" in slow.observation
    flood = env.step(format_action("execute_bash", {"cmd": "yes"}))
    assert flood.info.exec_error and "its output passed the sandbox's limit" in flood.observation
    assert len(flood.observation) < 25_000
    assert time.monotonic() - started < 10
    alive = env.step(format_action("execute_bash", {"cmd": "echo still here"}))
    assert "still here" in alive.observation and not alive.done
    env.close()


def test_lifecycle_errors_and_cleanup(env):
    assert isinstance(env, Environment)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(format_action("finish"))
    with pytest.raises(TypeError, match="SWETask"):
        env.reset({"task_id": "x"})
    env.reset(TASKS[0])
    root = Path(env.repo_dir).parent
    assert root.is_dir()
    env.close()
    assert not root.exists()  # the temporary directory is gone
    no_fixture = SWETask(
        task_id="r2e", docker_image="namanjain12/x:1", problem_statement="p", expected={"t.py::a": "PASSED"}
    )
    with pytest.raises(EpisodeStartError, match="did not start \\(twice\\).*needs a repository fixture"):
        env.reset(no_fixture)  # tried twice, then the episode fails alone (the rollout leaves it out)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backend": "kubernetes"}, "backend"),
        ({"max_turns": 0}, "max_turns"),
        ({"reward_timeout_s": 0}, "reward_timeout_s"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SWEConfig(**kwargs)


def test_tool_and_backend_config_validation():
    with pytest.raises(ValueError, match="command_timeout_s"):
        ToolSettings(command_timeout_s=0)
    with pytest.raises(ValueError, match="max_output_bytes"):
        LocalConfig(max_output_bytes=0)


def test_episode_leaves_no_processes_behind(env):
    env.reset(TASKS[0])
    started = env.step(format_action("execute_bash", {"cmd": "sleep 600 & echo $!"}))
    pid = int(started.observation.split("[STDOUT]\n\n")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_stale_bytecode_cache_cannot_forge_the_grade(env):
    """The fix compiled into the bytecode cache under a header that matches the unfixed source, which is put back
    byte for byte with its mtime: Python would load the cached fix without reading the source."""
    import importlib.util
    import py_compile
    import re
    import struct

    task = TASKS[0]
    env.reset(task)
    repo = Path(env.backend.repo_dir)
    names = re.findall(r"^\+\+\+ b/(\S+)", task.gold_patch, re.M)
    originals = {name: ((repo / name).read_bytes(), (repo / name).stat()) for name in names}
    for action in patch_actions(task.gold_patch, env.repo_dir, check_command=None)[:-1]:  # all but `finish`
        env.step(action)
    for name, (text, stat) in originals.items():
        source = repo / name
        cached = Path(importlib.util.cache_from_source(str(source)))
        py_compile.compile(str(source), cfile=str(cached))
        source.write_bytes(text)
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        data = bytearray(cached.read_bytes())
        data[8:16] = struct.pack("<II", int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size)
        cached.write_bytes(bytes(data))
    last = env.step(format_action("finish", {"command": "submit"}))
    assert last.reward == 0.0 and "FAILED" in env.last_test_log, env.last_test_log[-2000:]


def test_the_gold_fix_gets_1_by_either_reading_with_no_flag():
    task = TASKS[0]
    for grading in ("report", "r2e_gym_log"):
        environment = SWEEnv(SWEConfig(backend="local", grading=grading))
        try:
            last = play(environment, task, lambda e: patch_actions(task.gold_patch, e.repo_dir, check_command=None))
        finally:
            environment.close()
        assert last.reward == 1.0 and last.info.extra["tamper_flags"] == []
