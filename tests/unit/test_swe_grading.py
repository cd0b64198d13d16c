"""swe grading (pytest log -> statuses -> reward), task loading, the shipped tasks, and patch parsing."""

import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.environments.protocol import TaskSource
from trainer.environments.swe.grading import grade, parse_expected, parse_pytest_report, report_key
from trainer.environments.swe.oracle import Edit, patch_actions, patch_edits
from trainer.environments.swe.tasks import SWETasks, load_tasks, shipped_tasks_path, task_from_record
from trainer.environments.swe.tools import parse_action

# A pytest 8 `-rA` log, abridged by hand, with colour codes, class methods (two classes share a method name),
# parametrised ids, a failure message after " - ", a collection error without "::", a skip, an xfail and an xpass.
LOG = """\x1b[1m============================= test session starts ==============================\x1b[0m
collected 9 items / 1 error

r2e_tests/test_a.py .F.sxX..                                               [100%]
==================================== PASSES ====================================
=========================== short test summary info ============================
\x1b[32mPASSED\x1b[0m r2e_tests/test_a.py::test_one
PASSED r2e_tests/test_a.py::HTTPHeadersTest::test_copy
PASSED r2e_tests/test_a.py::CookieTest::test_copy
PASSED r2e_tests/test_a.py::TestStatistic::test_zero_length[mean]
FAILED r2e_tests/test_a.py::test_two - assert 1 == 2
SKIPPED [1] r2e_tests/test_a.py:20: not on this platform
XFAIL r2e_tests/test_a.py::test_known - reason: flaky
XPASS r2e_tests/test_a.py::test_lucky
ERROR r2e_tests/test_b.py - ImportError: cannot import name 'x'
========= 1 failed, 4 passed, 1 skipped, 1 xfailed, 1 xpassed, 1 error in 0.10s =========
"""
PARSED = {
    "test_one": "PASSED",
    "HTTPHeadersTest.test_copy": "PASSED",
    "CookieTest.test_copy": "PASSED",
    "TestStatistic.test_zero_length[mean]": "PASSED",
    "test_two": "FAILED",
    "": "ERROR",
}
"""By R2E-Gym's rules, by hand: everything after the file joined with dots, so the two test_copy methods stay
apart; the message after " - " cut; SKIPPED, XFAIL and XPASS dropped; the collection error named ""."""


def test_parse_report_hand_example():
    assert parse_pytest_report(LOG) == PARSED


def test_parse_report_without_summary_is_empty():
    assert parse_pytest_report("collected 0 items\nno tests ran") == {}
    assert parse_pytest_report("") == {}


@pytest.mark.parametrize(
    "line, key",
    [
        ("PASSED tests/deep/test_x.py::test_y", "test_y"),
        ("FAILED test_x.py::C::test_y[1] - boom", "C.test_y[1]"),
        ("PASSED \x1b[31mtest_x.py::Outer::Inner::test_z\x1b[0m", "Outer.Inner.test_z"),
        ("ERROR r2e_tests/test_b.py - ImportError", ""),
    ],
)
def test_report_key(line, key):
    assert report_key(line) == key


@pytest.mark.parametrize(
    "expected, reward",
    [
        # the collection error's empty name is compared like any name: a map that lists it matches this log
        ({**PARSED}, 1.0),
        # a map without it does not, even when the counts agree (R2E-Gym raises KeyError there; a rule that skipped
        # the empty name would pay a repository that breaks the import of a failing test's file)
        ({**{k: v for k, v in PARSED.items() if k}, "test_other": "PASSED"}, 0.0),
        # the same without the sixth entry: 5 expected vs 6 parsed, the count differs
        ({k: v for k, v in PARSED.items() if k}, 0.0),
        # one status differs
        ({**{k: v for k, v in PARSED.items() if k}, "test_two": "PASSED", "test_other": "PASSED"}, 0.0),
        # an XFAIL entry never matches (the parser drops that line)
        ({**PARSED, "test_known": "XFAIL"}, 0.0),
        # expected keys lose a " - message" tail and colour codes before comparing
        (
            {
                **{k: v for k, v in PARSED.items() if k != "test_two"},
                "test_two - assert 1 == 2": "FAILED",
            },
            1.0,
        ),
    ],
)
def test_grade_by_r2e_gyms_rule_on_a_hand_example(expected, reward):
    assert grade(parse_pytest_report(LOG), parse_expected(expected)).reward == reward


def test_grade_cases():
    expected = {"a": "PASSED", "b": "PASSED"}
    assert grade({"a": "PASSED", "b": "PASSED"}, expected).reward == 1.0
    missing = grade({"a": "PASSED"}, expected)
    assert (missing.reward, missing.missing) == (0.0, ["b"])
    extra = grade({"a": "PASSED", "b": "PASSED", "c": "PASSED"}, expected)
    assert (extra.reward, extra.unexpected) == (0.0, ["c"])
    wrong = grade({"a": "PASSED", "b": "FAILED"}, expected)
    assert (wrong.reward, wrong.mismatched) == (0.0, {"b": ("PASSED", "FAILED")})
    # an expected failure that fails matches, as in R2E-Gym's map comparison
    assert grade({"a": "FAILED"}, {"a": "FAILED"}).reward == 1.0
    assert grade({}, expected).reward == 0.0
    # a collection error does not stand in for a missing test: its empty name is compared too
    broken = grade({"a": "PASSED", "": "ERROR"}, expected)
    assert (broken.reward, broken.unexpected, broken.missing) == (0.0, [""], ["b"])
    assert grade({"a": "PASSED", "": "ERROR"}, {"a": "PASSED", "": "ERROR"}).reward == 1.0


def test_a_passed_line_whose_message_says_failed_reads_as_r2e_gym_reads_it():
    """R2E-Gym tests for "PASSED" before "FAILED" anywhere in the line: a failure whose message contains PASSED
    counts as passed. Kept, so that rewards equal R2E-Gym's."""
    log = "== short test summary info ==\nFAILED r2e_tests/t.py::test_a - assert 'PASSED' == 'x'\n"
    assert parse_pytest_report(log) == {"test_a": "PASSED"}


_maps = st.dictionaries(
    st.from_regex(r"[A-Z][a-z]{0,3}\.test_[a-z]{1,6}", fullmatch=True),
    st.sampled_from(["PASSED", "FAILED", "ERROR"]),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(expected=_maps, data=st.data())
def test_grade_property(expected, data):
    assert grade(dict(expected), expected).reward == 1.0
    key = data.draw(st.sampled_from(sorted(expected)))
    flipped = dict(expected, **{key: "FAILED" if expected[key] != "FAILED" else "PASSED"})
    assert grade(flipped, expected).reward == 0.0
    dropped = {k: v for k, v in expected.items() if k != key}
    assert grade(dropped, expected).reward == 0.0


@pytest.mark.parametrize(
    "value, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "non-empty JSON object"),
        ("{}", "non-empty JSON object"),
        ('{"test_a": "OK"}', "is not one of"),
    ],
)
def test_parse_expected_errors(value, message):
    with pytest.raises(ValueError, match=message):
        parse_expected(value)


# ----------------------------------------------------------------------------------------------------------------
# task files
# ----------------------------------------------------------------------------------------------------------------

RECORD = {
    "task_id": "x-1",
    "docker_image": "img:latest",
    "repo_name": "x",
    "problem_statement": "intro [ISSUE]\nThe bug.\n[/ISSUE] outro",
    "expected_output_json": json.dumps({"TestX.test_a": "PASSED"}),
    "repo_path": "repos/x",
}


def test_task_from_record_fields(tmp_path):
    task = task_from_record(dict(RECORD, extra_field=3), base_dir=tmp_path)
    assert task.issue == "The bug."
    assert task.expected == {"TestX.test_a": "PASSED"}
    assert task.repo_path == (tmp_path / "repos/x").resolve() and task.hidden_tests_path is None
    assert (task.split, task.extra) == ("train", {"extra_field": 3})
    no_tags = task_from_record(dict(RECORD, problem_statement="Plain text."))
    assert no_tags.issue == "Plain text."


@pytest.mark.parametrize(
    "change, message",
    [
        ({"docker_image": None}, "missing field 'docker_image'"),
        ({"problem_statement": None}, "missing field 'problem_statement'"),
        ({"split": "test"}, "field 'split' is 'test'"),
        ({"expected_output_json": "{}"}, "field 'expected_output_json'"),
        ({"problem_statement": 3}, "must be a string"),
    ],
)
def test_task_record_errors_name_the_field(change, message):
    record = {k: v for k, v in dict(RECORD, **change).items() if v is not None}
    with pytest.raises(ValueError, match=message):
        task_from_record(record)


def test_load_jsonl_and_parquet_agree(tmp_path):
    records = [RECORD, dict(RECORD, task_id="x-2", split="heldout")]
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    parquet = tmp_path / "tasks.parquet"
    pd.DataFrame(records).to_parquet(parquet)
    from_jsonl, from_parquet = load_tasks(jsonl), load_tasks(parquet)
    assert [t.task_id for t in from_jsonl] == ["x-1", "x-2"]
    assert [(t.task_id, t.split, t.expected, t.repo_path) for t in from_jsonl] == [
        (t.task_id, t.split, t.expected, t.repo_path) for t in from_parquet
    ]


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(RECORD) + "\n{oops\n")
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        load_tasks(bad)
    twice = tmp_path / "twice.jsonl"
    twice.write_text(json.dumps(RECORD) + "\n" + json.dumps(RECORD) + "\n")
    with pytest.raises(ValueError, match="'x-1' appears twice"):
        load_tasks(twice)
    with pytest.raises(ValueError, match="expected a .jsonl or .parquet"):
        load_tasks(bad.rename(tmp_path / "bad.csv"))
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    "field, value",
    [
        ("repo_path", "/etc"),
        ("repo_path", "../../../etc"),
        ("hidden_tests_path", "tests/../../secret"),
        ("hidden_tests_path", "/"),
    ],
)
def test_task_paths_stay_in_the_task_files_folder(tmp_path, field, value):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(dict(RECORD, **{field: value})) + "\n")
    with pytest.raises(
        ValueError,
        match=rf"tasks.jsonl entry 0 \(x-1\): field '{field}' is '{value}'.*"
        r"no absolute path, no '\.\.'",
    ):
        load_tasks(tasks)


def test_a_task_path_through_a_symlink_out_of_the_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "repos").symlink_to(outside, target_is_directory=True)
    (folder / "tasks.jsonl").write_text(json.dumps(RECORD) + "\n")
    with pytest.raises(ValueError, match=r"field 'repo_path' is 'repos/x', which leads through a symlink"):
        load_tasks(folder / "tasks.jsonl")


def test_an_oversized_issue_is_rejected_with_its_row(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps(RECORD) + "\n" + json.dumps(dict(RECORD, task_id="big", problem_statement="x" * 100_001)) + "\n"
    )
    with pytest.raises(ValueError, match=r"entry 1 \(big\): field 'problem_statement' has 100,001 characters"):
        load_tasks(tasks)


def test_malformed_task_files_name_the_file_and_line(tmp_path):
    listed = tmp_path / "listed.jsonl"
    listed.write_text(json.dumps(RECORD) + "\n" + json.dumps([RECORD]) + "\n")
    with pytest.raises(ValueError, match=r"listed.jsonl:2: expected a JSON object \(one task per line\), got list"):
        load_tasks(listed)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(RECORD).encode() + b'\n{"task_id": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin.jsonl.*not UTF-8"):
        load_tasks(latin)


def test_shipped_tasks_are_consistent():
    source = SWETasks()
    assert isinstance(source, TaskSource)
    train, heldout = source.tasks("train"), source.tasks("heldout")
    assert (len(train), len(heldout)) == (4, 2)
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert [t.task_id for t in source.tasks("train", 2)] == [t.task_id for t in train[:2]]
    for task in train + heldout:
        f2p, p2p = set(task.fail_to_pass), set(task.pass_to_pass)
        assert f2p and p2p and not f2p & p2p and f2p | p2p == set(task.expected)
        assert set(task.expected.values()) == {"PASSED"}
        repo_files = {p.name for p in Path(task.repo_path).rglob("*")}
        hidden = [p.name for p in Path(task.hidden_tests_path).glob("test_*.py")]
        assert hidden and not set(hidden) & repo_files  # hidden tests are not in the repository
        for patch in (task.gold_patch, task.p2p_breaking_patch):
            for edit in patch_edits(patch):
                # every hunk applies to the shipped buggy file exactly once
                assert (Path(task.repo_path) / edit.path).read_text().count(edit.old) == 1


def test_task_source_rejects_bad_arguments():
    source = SWETasks(shipped_tasks_path())
    with pytest.raises(ValueError, match="split"):
        source.tasks("test")
    with pytest.raises(ValueError, match="n must be"):
        source.tasks("train", -1)


# ----------------------------------------------------------------------------------------------------------------
# patches -> tool calls
# ----------------------------------------------------------------------------------------------------------------

PATCH = """--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,4 +1,4 @@
 def f(x):
-    return x + 1
+    return x + 2

 y = 1
@@ -10,2 +10,3 @@
 z = 3
+w = 4
\\ No newline at end of file
"""


def test_patch_edits_hand_example():
    # hunk 1: context "def f(x):", removed/added return line, an empty context line whose space was lost, "y = 1"
    assert patch_edits(PATCH) == [
        Edit("pkg/mod.py", "def f(x):\n    return x + 1\n\ny = 1\n", "def f(x):\n    return x + 2\n\ny = 1\n"),
        Edit("pkg/mod.py", "z = 3\n", "z = 3\nw = 4\n"),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no hunks"),
        ("hello\n", "unexpected text"),
        ("@@ -1 +1 @@\n-a\n+b\n", "hunk before any"),
        ("--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", "deletions"),
    ],
)
def test_patch_edits_errors(text, message):
    with pytest.raises(ValueError, match=message):
        patch_edits(text)


def test_patch_actions_are_parseable_tool_calls():
    actions = [parse_action(a) for a in patch_actions(PATCH, "/testbed")]
    assert [a.name for a in actions] == ["file_editor", "file_editor", "execute_bash", "finish"]
    assert actions[0].params == {
        "command": "str_replace",
        "path": "/testbed/pkg/mod.py",
        "old_str": "def f(x):\n    return x + 1\n\ny = 1",  # stripped by the parser
        "new_str": "def f(x):\n    return x + 2\n\ny = 1",
    }
