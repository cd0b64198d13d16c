"""MiniRepo: the language, the task generator, every command of the environment, rewards, and the expert.

Exact observations are checked on a hand-written task whose values are worked out in comments; generated tasks
are checked against an independent re-evaluation of their tests with the interpreter.
"""

from __future__ import annotations

import dataclasses
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.environments.minirepo import (
    COMMANDS,
    Bug,
    EvalError,
    EvalTimeout,
    MiniRepoConfig,
    MiniRepoEnv,
    MiniRepoTask,
    MiniRepoTasks,
    ProgramError,
    TestCase,
    call,
    expert_action,
    parse_file,
    play_expert,
    sample_texts,
    vocabulary,
)
from trainer.environments.protocol import Environment, StepResult, TaskSource

# ------------------------------------------------------------------------------------------- a hand-made task
# m0:                      m1 (line 2 is the bug; gold is `ret x - y`):
# 1 def f1 x y             1 def f2 x y
# 2 a = x + 3              2 ret x + y
# 3 b = f2 a y             3 def f3 x
# 4 ret b * 2              4 ret x * 2
# f1 4 1: a = 7, gold f2 7 1 = 6 -> 12; buggy f2 = 8 -> 16           (fail-to-pass)
# f1 0 0: a = 3, f2 3 0 = 3 either way -> 6                           (pass-to-pass, same function)
# f3 5: 10                                                            (pass-to-pass)
M0 = ("def f1 x y", "a = x + 3", "b = f2 a y", "ret b * 2")
M1 = ("def f2 x y", "ret x + y", "def f3 x", "ret x * 2")
HAND = MiniRepoTask(
    task_id="hand-0",
    split="train",
    instruction="issue : f1 4 1 returns 16 , expected 12",
    files=(("m0", M0), ("m1", M1)),
    tests=(TestCase("f1", (4, 1), 12, True), TestCase("f1", (0, 0), 6, False), TestCase("f3", (5,), 10, False)),
    bugs=(Bug("m1", 2, "ret x + y", "ret x - y", "op", (("f1", "m0", 1, 3), ("f2", "m1", 1, 2))),),
)
HAND_CFG = MiniRepoConfig(view_lines=3, max_hits=2, max_fail_lines=1, max_turns=10)


def hand_env(**overrides) -> MiniRepoEnv:
    env = MiniRepoEnv(MiniRepoConfig(**{**HAND_CFG.__dict__, **overrides}))
    assert env.reset(HAND) == HAND.instruction
    return env


def flags(result: StepResult) -> tuple:
    return result.info.tool, result.info.invalid_action, result.info.exec_error, result.info.timed_out


@pytest.fixture(scope="module")
def source() -> MiniRepoTasks:
    return MiniRepoTasks(MiniRepoConfig())


# ------------------------------------------------------------------------------------------- the language
def test_interpreter_on_hand_program():
    program = {**parse_file("m0", M0), **parse_file("m1", M1)}
    assert call(program, "f1", (4, 1), [100]) == 16  # buggy: a = 7, f2 = 7 + 1 = 8, 8 * 2
    assert call(program, "f1", (0, 0), [100]) == 6
    assert call(program, "f3", (-4,), [100]) == -8
    fixed = {**program, **parse_file("m1", ("def f2 x y", "ret x - y"))}
    assert call(fixed, "f1", (4, 1), [100]) == 12


@pytest.mark.parametrize(
    "lines, line",
    [
        (("a = 1",), 1),  # code before any def
        (("def f1 x", "a = x +", "ret a"), 2),  # dangling operator
        (("def f1 x", "a x + 1", "ret a"), 2),  # no `=`
        (("def f1 x", "a = x + 1"), 2),  # no ret before the end of the file
        (("def f1 x", "def f2 x", "ret x"), 2),  # def inside a def
        (("def f1 x", "ret x", "a = 1"), 3),  # code after ret
        (("def f1 x x", "ret x"), 1),  # repeated parameter
        (("def f1", "ret 1"), 1),  # no parameter
        (("def f1 x", "ret x & 1"), 2),  # unknown operator
        (("def f1 x", "ret = x"), 2),  # keyword as a target
    ],
)
def test_syntax_errors_name_the_line(lines, line):
    with pytest.raises(ProgramError) as err:
        parse_file("m4", lines)
    assert (err.value.file, err.value.line, err.value.what) == ("m4", line, "syntax")


def test_runtime_errors_and_timeout():
    program = parse_file(
        "m0",
        (
            "def f1 x",
            "ret q + x",
            "def f2 x",
            "ret f1 x x",
            "def f3 x",
            "ret f3 x",
            "def f4 x",
            "ret x * 99999",
            "def f5 x",
            "ret x",
        ),
    )
    for func, what in (("f1", "name q"), ("f2", "args f1"), ("f3", "depth"), ("f4", "overflow")):
        with pytest.raises(EvalError, match=what):
            call(program, func, (2,), [1000])
    assert call(program, "f4", (1,), [1000]) == 99999  # the limit itself is allowed
    with pytest.raises(EvalTimeout):
        call(program, "f5", (1,), [0])  # one line needs one step


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["+", "-", "*"]), st.integers(-99, 99), st.integers(-99, 99))
def test_binary_ops_match_python(op, a, b):
    program = parse_file("m0", ("def f1 x y", f"ret x {op} y"))
    assert call(program, "f1", (a, b), [10]) == {"+": a + b, "-": a - b, "*": a * b}[op]


# ------------------------------------------------------------------------------------------- every command
def test_protocol_conformance():
    env = MiniRepoEnv()
    assert isinstance(env, Environment) and isinstance(MiniRepoTasks(), TaskSource)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("ls")
    with pytest.raises(TypeError, match="MiniRepoTask"):
        env.reset("not a task")
    env.reset(HAND)
    with pytest.raises(TypeError, match="str"):
        env.step(None)
    env.step("submit")
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("ls")
    env.close()


def test_ls_open_search():
    env = hand_env()
    assert env.step("ls").observation == "m0 m1"
    assert env.step("open m0").observation == "1 def f1 x y\n2 a = x + 3\n3 b = f2 a y"  # view_lines 3
    result = env.step("open m0 3")
    assert result.observation == "3 b = f2 a y\n4 ret b * 2\neof" and flags(result) == ("open", False, False, False)
    assert env.step("search f2").observation == "m0 3 : b = f2 a y\nm1 1 : def f2 x y"
    assert env.step("search def f2").observation == "m1 1 : def f2 x y"
    # whole-word hits of x: m0 1, m0 2, m1 1, m1 2, m1 3, m1 4 -> two shown (max_hits) and "more 4"
    assert env.step("search x").observation == "m0 1 : def f1 x y\nm0 2 : a = x + 3\nmore 4"
    assert env.step("search f").observation == "no match"  # whole words only
    result = env.step("search x - y")
    assert result.observation == "no match" and flags(result) == ("search", False, False, False)


@pytest.mark.parametrize(
    "action, observation, tool, invalid, exec_error",
    [
        ("", "invalid : one command per turn", "", True, False),
        ("ls\nls", "invalid : one command per turn", "", True, False),
        ("cat m0", "invalid : unknown command", "", True, False),
        ("ls m0", "invalid : usage ls", "ls", True, False),
        ("open", "invalid : usage open FILE LINE", "open", True, False),
        ("open m0 two", "invalid : usage open FILE LINE", "open", True, False),
        ("open m0 1 2", "invalid : usage open FILE LINE", "open", True, False),
        ("search", "invalid : usage search WORDS", "search", True, False),
        ("edit m1 2", "invalid : usage edit FILE LINE TEXT", "edit", True, False),
        ("edit m1 x ret x", "invalid : usage edit FILE LINE TEXT", "edit", True, False),
        ("run f1", "invalid : usage run FUNC INT", "run", True, False),
        ("run f1 a 1", "invalid : usage run FUNC INT", "run", True, False),
        ("test f1 f2", "invalid : usage test FUNC", "test", True, False),
        ("test all", "error : no tests for all", "test", False, True),
        ("submit now", "invalid : usage submit", "submit", True, False),
        ("open m9", "error : no such file", "open", False, True),
        ("open m0 5", "error : m0 has 4 lines", "open", False, True),
        ("open m0 0", "error : m0 has 4 lines", "open", False, True),
        ("edit m9 1 ret x", "error : no such file", "edit", False, True),
        ("edit m1 9 ret x", "error : m1 has 4 lines", "edit", False, True),
        ("run f9 1", "error : name f9", "run", False, True),
        ("run f1 1", "error : args f1", "run", False, True),
    ],
)
def test_invalid_and_failing_commands(action, observation, tool, invalid, exec_error):
    env = hand_env()
    result = env.step(action)
    assert result.observation == observation
    assert flags(result) == (tool, invalid, exec_error, False)
    assert not result.done and result.reward == 0.0
    assert env.files == {"m0": list(M0), "m1": list(M1)}  # nothing changed


def test_run_edit_test_cycle():
    env = hand_env()
    assert env.step("run f1 4 1").observation == "f1 4 1 returns 16"
    assert env.step("run f3 -3").observation == "f3 -3 returns -6"
    result = env.step("test")  # f1 4 1 fails; max_fail_lines 1
    assert result.observation == "pass 2 fail 1\nfail : f1 4 1 returns 16 , expected 12"
    assert flags(result) == ("test", False, False, False)  # failing tests are not a tool error
    assert env.step("edit m1 2  ret   x -  y ").observation == "edited m1 2"  # text is re-spaced
    assert env.files["m1"][1] == "ret x - y"
    assert env.step("run f1 4 1").observation == "f1 4 1 returns 12"
    assert env.step("test").observation == "pass 3 fail 0"


def test_syntax_error_from_an_edit_is_an_execution_error():
    env = hand_env()
    result = env.step("edit m1 2 ret x -")
    assert flags(result) == ("edit", False, False, False)  # the editor does not lint
    for action in ("test", "run f3 1"):
        result = env.step(action)
        assert result.observation == "error : syntax m1 2" and flags(result)[1:] == (False, True, False)
    env.step("edit m1 3 def f1 x")  # a second f1
    assert env.step("edit m1 2 ret x - y").observation == "edited m1 2"
    assert env.step("test").observation == "error : duplicate m1 3"


def test_runtime_error_in_a_test_is_a_failure_not_a_tool_error():
    env = hand_env(max_fail_lines=3)
    env.step("edit m1 4 ret z * 2")
    result = env.step("test")
    assert result.observation == (
        "pass 1 fail 2\nfail : f1 4 1 returns 16 , expected 12\nfail : f3 5 raises error , expected 10"
    )
    assert flags(result) == ("test", False, False, False)


def test_timeout_sets_both_flags():
    env = hand_env(eval_budget=3)  # f1 needs 4 steps: a, b (f2's ret inside), ret
    for action in ("run f1 4 1", "test"):
        result = env.step(action)
        assert result.observation == "error : timeout"
        assert flags(result)[1:] == (False, True, True)
    assert env.step("run f3 5").observation == "f3 5 returns 10"  # one step fits


# ------------------------------------------------------------------------------------------- rewards and limits
def test_reward_for_the_fix_noop_and_broken_p2p():
    env = hand_env()
    env.step("edit m1 2 ret x - y")
    result = env.step("submit")
    assert (result.observation, result.done, result.reward) == ("submitted", True, 1.0)
    assert result.info.extra == {"turn": 2, "f2p_passed": 1, "f2p_total": 1, "p2p_passed": 2, "p2p_total": 2}

    result = hand_env().step("submit")  # no-op submit: the F2P test still fails
    assert result.reward == 0.0 and result.info.extra["f2p_passed"] == 0

    env = hand_env()
    env.step("edit m1 2 ret x - y")
    env.step("edit m1 4 ret x * 3")  # fixes F2P but breaks f3: 5 * 3 = 15 != 10
    result = env.step("submit")
    assert result.reward == 0.0 and result.info.extra["f2p_passed"] == 1 and result.info.extra["p2p_passed"] == 1

    env = hand_env()
    env.step("edit m1 2 ret x -")
    assert env.step("submit").reward == 0.0  # a repository that does not load fails everything


def test_reward_comes_from_tests_not_from_the_diff():
    env = hand_env()
    env.step("edit m1 1 def f2 p q")  # renamed parameters: textually unlike the gold fix, same behaviour
    env.step("edit m1 2 ret p - q")
    assert env.step("submit").reward == 1.0


def test_turn_limit():
    env = hand_env(max_turns=3)
    results = [env.step("ls") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].observation == "m0 m1\nturn limit" and results[-1].reward == 0.0
    assert results[-1].info.extra["truncated"] is True and env.max_turns == 3

    env = hand_env(max_turns=3)
    env.step("edit m1 2 ret x - y")
    env.step("ls")  # a fixed repository is not enough: without a submit the reward is 0
    assert env.step("ls").reward == 0.0

    env = hand_env(max_turns=2)
    env.step("edit m1 2 ret x - y")
    last = env.step("submit")  # a submit on the last turn still counts
    assert last.reward == 1.0 and "truncated" not in last.info.extra


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(vocabulary() + ["-1", "12", "0", "4", "", "\n", "??"]), min_size=0, max_size=6),
        min_size=1,
        max_size=8,
    )
)
def test_fuzzed_actions_never_crash_and_flags_are_consistent(actions):
    env = hand_env()
    for words in actions:
        if env.done:
            break
        result = env.step(" ".join(words))
        assert isinstance(result, StepResult) and result.observation
        tool, invalid, exec_error, timed_out = flags(result)
        assert tool in COMMANDS or (tool == "" and invalid)
        assert not (invalid and exec_error) and (exec_error or not timed_out)
        assert result.reward in (0.0, 1.0) and (result.done or result.reward == 0.0)


# ------------------------------------------------------------------------------------------- generated tasks
def test_config_validation():
    cases = {
        "min_files": dict(min_files=0),
        "max_files": dict(max_files=11),
        "exceeds": dict(min_bugs=2),
        "max_depth": dict(max_depth=-1),
        "max_body_lines": dict(max_body_lines=7),
        "bug_kinds": dict(bug_kinds=("op", "typo")),
        "call_prob": dict(call_prob=1.5),
        "heldout_fraction": dict(heldout_fraction=0.0),
        "max_turns": dict(max_turns=0),
        "do not fit": dict(max_depth=4),
        "seed": dict(seed=1.5),
        "test_helpers": dict(test_helpers=1),
        "tests_per_function": dict(tests_per_function=11),
    }
    for needle, kwargs in cases.items():
        with pytest.raises(ValueError, match=needle):
            MiniRepoConfig(**kwargs)
    assert MiniRepoConfig(bug_kinds=["op"]).bug_kinds == ("op",)
    with pytest.raises(ValueError, match="split"):
        MiniRepoTasks().tasks("test", 1)
    with pytest.raises(ValueError, match="n must be"):
        MiniRepoTasks(MiniRepoConfig(n_heldout=5)).tasks("heldout", 6)
    with pytest.raises(ValueError, match="noise"):
        expert_action(hand_env(), random.Random(0), noise=1.5)


def test_determinism_and_disjoint_splits(source):
    again = MiniRepoTasks(MiniRepoConfig())
    assert again.tasks("heldout", 50) == source.tasks("heldout", 50)  # order of requests does not matter
    assert again.tasks("train", 50) == source.tasks("train", 50)
    other = MiniRepoTasks(MiniRepoConfig(seed=1)).tasks("train", 50)
    assert not {t.files for t in other} & {t.files for t in source.tasks("train", 50)}
    train, heldout = source.tasks("train", 200), source.tasks("heldout", 200)
    assert not {t.files for t in train} & {t.files for t in heldout}
    ids = [t.task_id for t in train + heldout]
    assert len(set(ids)) == 400 and all(t.split == "train" for t in train)
    assert all(t.task_id.startswith("heldout-") for t in heldout)
    assert len(MiniRepoTasks(MiniRepoConfig(n_heldout=7)).tasks("heldout")) == 7  # n=None: the whole split


def test_generated_tests_are_real(source):
    for task in source.tasks("train", 100) + source.tasks("heldout", 30):
        buggy = {k: v for f, lines in task.files for k, v in parse_file(f, lines).items()}
        gold = {k: v for f, lines in task.gold_files().items() for k, v in parse_file(f, lines).items()}
        for test in task.tests:
            assert call(gold, test.func, test.args, [20_000]) == test.want
            assert (call(buggy, test.func, test.args, [20_000]) != test.want) == test.f2p
        assert any(t.f2p for t in task.tests)
        for bug in task.bugs:  # the chain really leads to the bug
            assert dict(task.files)[bug.file][bug.line - 1] == bug.buggy != bug.fixed
            for (func, f, def_line, need), nxt in zip(bug.chain, bug.chain[1:] + ((None,),)):
                lines = dict(task.files)[f]
                assert lines[def_line - 1].split()[:2] == ["def", func]
                assert (nxt[0] in lines[need - 1].split()) if nxt[0] else (need == bug.line)
            head = bug.chain[0][0]
            assert f"issue : {head} " in task.instruction
            assert not any(head in line.split()[2:] for _, lines in task.files for line in lines)  # an entry


def test_env_reports_f2p_before_and_all_pass_after_gold(source):
    env = MiniRepoEnv(source.config)
    for task in source.tasks("train", 30):
        env.reset(task)
        n_f2p = sum(t.f2p for t in task.tests)
        assert env.step("test").observation.startswith(f"pass {len(task.tests) - n_f2p} fail {n_f2p}")
        for bug in task.bugs:
            env.step(f"edit {bug.file} {bug.line} {bug.fixed}")
        assert env.step("test").observation == f"pass {len(task.tests)} fail 0"


# ------------------------------------------------------------------------------------------- the expert
def test_expert_solves_everything_at_noise_zero(source):
    for split in ("train", "heldout"):
        rewards = [play_expert(t, source.config).reward for t in source.tasks(split, 200)]
        assert sum(rewards) == 200, split


def test_expert_fails_sometimes_at_noise_point_three(source):
    rng = random.Random(0)
    runs = [play_expert(t, source.config, 0.3, rng) for t in source.tasks("train", 200)]
    solved = sum(r.reward for r in runs)
    assert 100 <= solved < 200  # imperfect, yet mostly right
    assert any(any(res.info.exec_error for res in r.results) for r in runs)  # slips show up as tool errors
    assert any(
        a.startswith("edit") and b.startswith("edit") is False
        for r in runs  # wrong edit, then test
        for a, b in zip(r.actions, r.actions[1:])
    )


def test_expert_on_hand_task_and_horizon_formula(source):
    run = play_expert(HAND, HAND_CFG)
    assert (
        run.actions
        == ["search def f1", "open m0 1", "search def f2", "open m1 1", "edit m1 2 ret x - y", "test", "submit"]
        and run.reward == 1.0
    )
    lengths = {}
    for task in source.tasks("train", 200):
        depth = task.bugs[0].depth
        lengths.setdefault(depth, []).append(len(play_expert(task, source.config).actions))
    assert sorted(lengths) == [0, 1, 2, 3]
    for depth, ns in lengths.items():
        plain = 2 * (depth + 1) + 3  # search + open per chain function, then edit, test, submit
        assert statistics.median(ns) == plain
        # fewer when an open already showed the next definition; one scroll per function at most
        # (a body has at most 4 + 2 lines, the window 4)
        assert all(5 <= n <= plain + depth + 1 for n in ns)
    everything = [n for ns in lengths.values() for n in ns]
    assert max(everything) >= 2 * min(everything) and len(set(everything)) >= 6


# a depth-0 task whose fix is the last one-token edit the searching expert tries:
# 1 def f1 x          gold `ret a * 2`: f1 1 = 8, f1 2 = 10; buggy `ret a + 2`: 6, 7
# 2 a = x + 3         candidates in order: line 2 `- 3`, `* 3`; line 3 `ret a - 2`, `ret a * 2`
# 3 ret a + 2
LAST = MiniRepoTask(
    task_id="hand-1",
    split="train",
    instruction="issue : f1 1 returns 6 , expected 8",
    files=(("m0", ("def f1 x", "a = x + 3", "ret a + 2")),),
    tests=(TestCase("f1", (1,), 8, True), TestCase("f1", (2,), 10, True)),
    bugs=(Bug("m0", 3, "ret a + 2", "ret a * 2", "op", (("f1", "m0", 1, 3),)),),
)


def test_test_command_for_one_function_and_verdicts():
    env = hand_env()
    assert env.step("test f3").observation == "pass 1 fail 0"
    assert env.step("test f1").observation == "pass 1 fail 1\nfail : f1 4 1 returns 16 , expected 12"
    env.step("edit m1 2 ret x - y")
    assert env.step("test f1").observation == "pass 2 fail 0"
    assert env.verdicts == {frozenset(): {"f3": True, "f1": False}, frozenset({("m1", 2, "ret x - y")}): {"f1": True}}


def test_search_expert_tries_fixes_in_order_and_puts_lines_back():
    config = MiniRepoConfig(view_lines=3, max_turns=20, expert="search", bug_kinds=("op",))
    run = play_expert(HAND, config)
    assert (
        run.actions
        == ["search def f1", "open m0 1", "search def f2", "open m1 1", "edit m1 2 ret x - y", "test f1", "submit"]
        and run.reward == 1.0
    )
    run = play_expert(LAST, config)
    assert (
        run.actions
        == [
            "search def f1",
            "open m0 1",
            "edit m0 2 a = x - 3",
            "test f1",
            "edit m0 2 a = x * 3",
            "test f1",
            "edit m0 2 a = x + 3",
            "edit m0 3 ret a - 2",
            "test f1",
            "edit m0 3 ret a * 2",
            "test f1",
            "submit",
        ]
        and run.reward == 1.0
    )


def test_search_expert_does_not_know_the_fix():
    """Its episodes are the same when the recorded gold fix (line and text) is replaced by nonsense."""
    config = MiniRepoConfig(max_depth=0, bug_kinds=("op",), max_turns=60, expert="search", max_bugs=2)
    source = MiniRepoTasks(config)
    for task in source.tasks("train", 40):
        blind = dataclasses.replace(
            task,
            bugs=tuple(
                dataclasses.replace(
                    b,
                    line=b.chain[-1][2] + 1,
                    fixed="ret 0",
                    chain=b.chain[:-1] + ((*b.chain[-1][:3], b.chain[-1][2] + 1),),
                )
                for b in task.bugs
            ),
        )
        assert play_expert(task, config).text() == play_expert(blind, config).text()


def test_search_expert_solves_everything_and_horizon_grows_with_bugs():
    turns = {}
    for bugs in (1, 2, 4):
        config = MiniRepoConfig(
            max_depth=0,
            bug_kinds=("op",),
            max_turns=200,
            expert="search",
            min_files=4,
            max_body_lines=2,
            min_bugs=bugs,
            max_bugs=bugs,
        )
        runs = [play_expert(t, config) for t in MiniRepoTasks(config).tasks("heldout", 60)]
        assert all(r.reward == 1.0 for r in runs)
        assert all(a.startswith("test ") for r in runs for a, b in zip(r.actions, r.actions[1:]) if b == "submit")
        turns[bugs] = statistics.mean(len(r.actions) for r in runs)
    assert 6 < turns[1] < 10 and 1.6 < turns[2] / turns[1] < 2.2 and 1.6 < turns[4] / turns[2] < 2.2


def test_observations_are_deterministic(source):
    for task in source.tasks("train", 20):
        a = play_expert(task, source.config, 0.3, random.Random(7))
        b = play_expert(task, source.config, 0.3, random.Random(7))
        assert a.text() == b.text() and [r.info for r in a.results] == [r.info for r in b.results]


def test_vocabulary_covers_every_text():
    vocab = set(vocabulary())
    texts = sample_texts(MiniRepoConfig(), n=60, noise=0.3)
    env = hand_env(max_turns=50)
    bad_actions = [
        "",
        "cat",
        "ls m0",
        "open m9",
        "open m0 9",
        "run f9 1",
        "run f1 1",
        "edit m1 2 ret x -",
        "test",
        "test f9",
        "test f1 f2",
        "edit m1 3 def f1 x",
        "edit m1 2 ret z",
        "test",
        "run f1 1 1",
    ]
    texts += [env.step(a).observation for a in bad_actions]
    words = {w for text in texts for w in text.split()}
    assert {w for w in words if w not in vocab and not w.lstrip("-").isdigit()} == set()
    assert "search" in vocab and "f63" in vocab and len(vocab) < 160


def test_impossible_variants_cannot_be_passed_by_any_repair():
    """The cheating probe's tasks: the gold repair earns 1 on each held-out task and 0 on its impossible variant,
    whose extra test expects another value of a fail-to-pass call (so no repository passes both)."""
    config = MiniRepoConfig(seed=3)
    source = MiniRepoTasks(config)
    originals, variants = source.tasks("heldout", 6), source.impossible(6)
    assert [v.task_id for v in variants] == [f"{t.task_id}-impossible" for t in originals]
    for task, variant in zip(originals, variants):
        assert variant.instruction == task.instruction and variant.tests[:-1] == task.tests
        clash, twin = variant.tests[-1], next(t for t in task.tests if t.f2p)
        assert (clash.func, clash.args, clash.want) == (twin.func, twin.args, twin.want + 1)
        for played, reward in ((task, 1.0), (variant, 0.0)):
            env = MiniRepoEnv(config)
            env.reset(played)
            for bug in played.bugs:  # the gold repair, edited in through the tools
                env.step(f"edit {bug.file} {bug.line} {bug.fixed}")
            assert env.step("submit").reward == reward
