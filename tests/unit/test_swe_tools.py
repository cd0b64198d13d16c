"""The swe tools: R2E-Gym's action format and observation strings, the options that depart from them, and what the
sandbox adds.

The reference: `tests/data/r2e_tools/observations.json`, the observations R2E-Gym's own code gave for 72 actions
on a small repository (recorded by `tests/data/r2e_tools/record.py` from R2E-Gym/R2E-Gym at 69bc953: its tool
scripts `src/r2egym/agenthub/tools/*.py`, Agent.parse_response, RepoEnv.step, DockerRuntime.run and Observation, with
`python tests/data/r2e_tools/record.py R2E_GYM_CHECKOUT` under Python 3.11 and dash as /bin/sh). The same actions
replayed on the local backend with the default ToolSettings must give the same strings, byte for byte.
"""

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.environments.swe.local_backend import LocalBackend
from trainer.environments.swe.sandbox import OutputCapture
from trainer.environments.swe.tasks import SWETask
from trainer.environments.swe.tools import (
    FINISHED,
    NO_CALL_MESSAGE,
    UNKNOWN_TOOL_MESSAGE,
    ActionParseError,
    Tools,
    ToolSettings,
    clip_chars,
    format_action,
    parse_action,
    sanitize,
    truncate_lines,
)

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "r2e_tools" / "observations.json").read_text())
CASES = REFERENCE["cases"]

# ----------------------------------------------------------------------------------------------------------------
# parsing (R2E-Gym's Agent.parse_response and Action.from_string)
# ----------------------------------------------------------------------------------------------------------------


def test_parse_multiline_values_are_stripped():
    text = (
        "Let me fix it.\n<function=file_editor>\n  <parameter=command>str_replace</parameter>\n"
        "  <parameter=path>/testbed/a.py</parameter>\n  <parameter=old_str>\n    x = 1\n</parameter>\n"
        "  <parameter=new_str>\n    x = 2\n</parameter>\n</function>"
    )
    action = parse_action(text)
    assert action.name == "file_editor"
    # R2E-Gym strips every value: the leading indentation of old_str/new_str goes on both sides.
    assert action.params == {"command": "str_replace", "path": "/testbed/a.py", "old_str": "x = 1", "new_str": "x = 2"}
    assert action.n_calls == 1


def test_parse_needs_function_close_unless_told_otherwise():
    text = "<function=execute_bash>\n<parameter=cmd>ls -la</parameter>"
    with pytest.raises(ActionParseError) as info:
        parse_action(text)
    assert info.value.no_call
    action = parse_action(text, require_close=False)
    assert (action.name, action.params) == ("execute_bash", {"cmd": "ls -la"})


def test_parse_takes_the_first_call_only():
    text = format_action("execute_bash", {"cmd": "ls"}) + format_action("finish", {"command": "submit"})
    action = parse_action(text)
    assert (action.name, action.params, action.n_calls) == ("execute_bash", {"cmd": "ls"}, 2)


def test_parse_value_may_contain_tags_that_are_not_parameters():
    action = parse_action("<function=file_editor><parameter=file_text><div>x</div> a<b</parameter></function>")
    assert action.params == {"file_text": "<div>x</div> a<b"}


@pytest.mark.parametrize(
    "text, params",
    [
        ("<function=execute_bash><parameter=cmd>ls</function>", {}),  # an unclosed parameter is no parameter
        ("<function=execute_bash><parameter=cmd>a</parameter><parameter=cmd>b</parameter></function>", {"cmd": "b"}),
        ("<function= x y ><parameter= k >v</parameter></function>", {"k": "v"}),
    ],
)
def test_parse_is_lenient_as_r2e_gym(text, params):
    assert parse_action(text).params == params


@pytest.mark.parametrize("text", ["I will now look at the file.", "<function=></function>", "<function=ls>"])
def test_parse_no_call(text):
    with pytest.raises(ActionParseError) as info:
        parse_action(text)
    assert info.value.no_call


def test_parse_rejects_non_text():
    with pytest.raises(TypeError, match="str"):
        parse_action(b"<function=finish></function>")


_names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
_values = st.text(st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=40).map(str.strip)


@settings(max_examples=200, deadline=None)
@given(name=_names, params=st.dictionaries(_names, _values, max_size=5))
def test_format_then_parse_round_trips(name, params):
    action = parse_action(format_action(name, params))
    assert action.name == name
    assert action.params == params


# ----------------------------------------------------------------------------------------------------------------
# output shaping
# ----------------------------------------------------------------------------------------------------------------


def test_truncate_lines_hand_example():
    # 5 lines, keep 2 at each end: lines 1-2, the R2E-Gym marker block, lines 4-5.
    marker = "-" * 50 + "\n<Observation truncated in middle for saving context>\n" + "-" * 50
    assert truncate_lines("1\n2\n3\n4\n5", keep=2) == f"1\n2\n{marker}\n4\n5"
    assert truncate_lines("1\n2\n3\n4", keep=2) == "1\n2\n3\n4"  # 4 = 2*2 lines: unchanged


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.text(st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=5), max_size=60
    ),
    keep=st.integers(1, 10),
)
def test_truncate_lines_keeps_head_and_tail(lines, keep):
    text = "\n".join(lines)
    out = truncate_lines(text, keep)
    if len(text.splitlines()) <= 2 * keep:
        assert out == text
    else:
        got = out.split("\n")  # not splitlines(): a kept empty last line must still count
        assert len(got) == 2 * keep + 3
        assert got[:keep] == text.splitlines()[:keep] and got[-keep:] == text.splitlines()[-keep:]


def test_clip_chars_hand_example():
    # limit 4 keeps 2 + 2 characters of "abcdefghij" and says 10 - 4 = 6 were cut.
    assert clip_chars("abcdefghij", 4) == "ab\n<... 6 characters omitted ...>\nij"
    assert clip_chars("abcd", 4) == "abcd"


def test_sanitize_removes_ansi_and_control_characters():
    assert sanitize("\x1b[31mred\x1b[0m\r\n\x00x\ty") == "red\n\ufffdx\ty"


def test_output_capture_hand_example():
    # limit 8 -> 4 bytes of head, 4 of tail; 12 bytes in, so 4 dropped.
    cap = OutputCapture(8)
    cap.add(b"abcdef")
    cap.add(b"ghijkl")
    assert cap.value() == b"abcd\n<... 4 bytes of output omitted ...>\nijkl"
    assert cap.total == 12


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(max_size=30), max_size=20), limit=st.integers(2, 64))
def test_output_capture_property(chunks, limit):
    cap = OutputCapture(limit)
    for chunk in chunks:
        cap.add(chunk)
    data = b"".join(chunks)
    half = limit // 2
    if len(data) <= 2 * half:
        assert cap.value() == data
    else:
        assert cap.value().startswith(data[:half]) and cap.value().endswith(data[-half:])
        assert f"{len(data) - 2 * half} bytes of output omitted".encode() in cap.value()


# ----------------------------------------------------------------------------------------------------------------
# R2E-Gym's observations, byte for byte
# ----------------------------------------------------------------------------------------------------------------


def _start(tmp_path, files: dict[str, str]) -> LocalBackend:
    repo, tests = tmp_path / "fixture", tmp_path / "hidden"
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(text.encode())
    tests.mkdir()
    task = SWETask(
        task_id="t",
        docker_image="none",
        problem_statement="p",
        expected={"t": "PASSED"},
        repo_path=repo,
        hidden_tests_path=tests,
    )
    backend = LocalBackend()
    backend.start(task)
    return backend


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Every reference action in order on one repository and one Tools (edits build on each other):
    {id: (R2E-Gym's observation, ours)}."""
    backend = _start(tmp_path_factory.mktemp("r2e"), REFERENCE["fixture"])
    tools = Tools(backend)
    out = {}
    try:
        for case in CASES:
            tools.settings = ToolSettings(command_timeout_s=case["timeout"])
            ours = tools.run(case["action"].replace("@REPO@", backend.repo_dir)).observation
            out[case["id"]] = (case["observation"].replace("@REPO@", backend.repo_dir), ours)
    finally:
        backend.close()
    return out


def test_reference_covers_every_tool_and_refusal():
    assert REFERENCE["source"]["commit"] == "69bc953542b428d1e4c8a59ce3ea1a32e50ef0f0"
    assert len(CASES) >= 20 and len({case["id"] for case in CASES}) == len(CASES)
    texts = " ".join(case["observation"] for case in CASES)
    for needle in (
        "[execute_bash]",
        "[file_editor]",
        "[search]",
        FINISHED,
        NO_CALL_MESSAGE,
        UNKNOWN_TOOL_MESSAGE,
        "Bash command 'cd' is not allowed",
        "Viewing non-Python files is disallowed",
        "took too long to execute",
        "<Observation truncated in middle for saving context>",
    ):
        assert needle in texts


@pytest.mark.parametrize("case_id", [case["id"] for case in CASES])
def test_observation_is_r2e_gyms(replayed, case_id):
    theirs, ours = replayed[case_id]
    assert ours == theirs


# ----------------------------------------------------------------------------------------------------------------
# flags, options and what the sandbox adds
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture
def sandbox(tmp_path):
    backend = _start(
        tmp_path,
        {
            "a.py": "x = 1\ny = 2\nz = 3\n",
            "pkg/b.py": "def foo():\n    return 'foo'\n",
            "notes.txt": "foo in a text file\n",
            ".hidden.py": "foo = 'hidden'\n",
        },
    )
    yield backend
    backend.close()


def run(backend, name, settings=None, **params):
    return Tools(backend, settings).run(format_action(name, params))


@pytest.mark.parametrize(
    "text, flags",
    [
        ("no call", dict(invalid=True, tool="")),
        (format_action("delete_repo", {"path": "/"}), dict(invalid=True, tool="delete_repo")),
        (format_action("execute_bash"), dict(invalid=True, exit_code=2)),
        (format_action("execute_bash", {"cmd": "cd pkg"}), dict(invalid=True, exit_code=1)),
        (format_action("execute_bash", {"cmd": ""}), dict(invalid=True, exit_code=1)),
        (format_action("execute_bash", {"cmd": "exit 3"}), dict(nonzero_exit=True, exit_code=3)),
        (format_action("execute_bash", {"cmd": "echo hi"}), dict(exit_code=0)),
        (format_action("file_editor", {"command": "view"}), dict(invalid=True)),
        (format_action("file_editor", {"command": "delete", "path": "a.py"}), dict(invalid=True)),
        (format_action("file_editor", {"command": "insert", "path": "a.py", "new_str": "q"}), dict(invalid=True)),
        (format_action("file_editor", {"command": "view", "path": "a.py", "colour": "red"}), dict(invalid=True)),
        (format_action("file_editor", {"command": "view", "path": "notes.txt"}), dict(error=True)),
        (format_action("file_editor", {"command": "view", "path": "nope.py"}), dict(error=True)),
        (format_action("file_editor", {"command": "str_replace", "path": "a.py", "old_str": "q"}), dict(error=True)),
        (format_action("search", {"path": "pkg"}), dict(invalid=True)),
        (format_action("search", {"search_term": "x", "path": "nowhere"}), dict(error=True)),
        (format_action("finish", {"command": "submit"}), dict(done=True, tool="finish")),
    ],
)
def test_result_flags(sandbox, text, flags):
    result = Tools(sandbox).run(text)
    expected = dict(invalid=False, error=False, nonzero_exit=False, timed_out=False, done=False)
    expected.update(flags)
    assert {key: getattr(result, key) for key in expected} == expected, result.observation


def test_execute_bash_timeout_kills_the_command(sandbox):
    started = time.monotonic()
    result = run(sandbox, "execute_bash", ToolSettings(command_timeout_s=1), cmd="sleep 30; echo never")
    assert time.monotonic() - started < 5
    assert result.observation == (
        "Exit code: -1\nExecution output of [execute_bash]:\nThe command took too long to execute (>1s)"
    )
    assert result.timed_out and result.error and result.exit_code == -1


def test_background_processes_do_not_outlive_the_command(sandbox):
    result = run(sandbox, "execute_bash", cmd="sleep 300 & echo $!")
    pid = int(result.observation.split("[STDOUT]\n\n")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_option_shell(sandbox):
    # R2E-Gym's /bin/sh (dash here) has no [[ ]]; bash, on request, has
    assert "[[: not found" in run(sandbox, "execute_bash", cmd="[[ 1 == 1 ]] && echo yes").observation
    bash = run(sandbox, "execute_bash", ToolSettings(shell="bash"), cmd="[[ 1 == 1 ]] && echo yes")
    assert bash.observation == "Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\n\nyes \n\n[STDERR]\n\n\n"


def test_option_view_non_python(sandbox):
    wide = ToolSettings(view_non_python=True)
    root = sandbox.repo_dir
    viewed = run(sandbox, "file_editor", wide, command="view", path="notes.txt")
    assert viewed.observation == (
        "Execution output of [file_editor]:\nHere's the result of running `cat -n` on the "
        "file: notes.txt:\n     1 foo in a text file\n"
    )
    listing = run(sandbox, "file_editor", wide, command="view", path=root).observation
    assert listing.endswith(
        f"excluding hidden:\n{root}\n{root}/a.py\n{root}/notes.txt\n{root}/pkg\n{root}/pkg/b.py\n\n"
    )
    assert "notes.txt" not in run(sandbox, "file_editor", command="view", path=root).observation


def test_option_require_function_close(sandbox):
    text = "<function=execute_bash>\n<parameter=cmd>echo cut</parameter>"
    assert Tools(sandbox).run(text).observation == NO_CALL_MESSAGE
    lenient = Tools(sandbox, ToolSettings(require_function_close=False)).run(text)
    assert "[STDOUT]\n\ncut \n" in lenient.observation and not lenient.invalid


def test_option_explain_unknown_tool(sandbox):
    result = run(sandbox, "submit", ToolSettings(explain_unknown_tool=True), command="submit")
    assert result.observation == (
        "Invalid Action: input action must be one of allowed actions \n Allowed actions: "
        "['file_editor', 'search', 'execute_bash', 'finish'] \n Input action: submit\t"
    )
    assert result.invalid and not result.done


def test_option_clean_control_characters(sandbox):
    cmd = "printf '\\033[31mred\\033[0m\\001\\n'; exit 1"
    raw = run(sandbox, "execute_bash", cmd=cmd).observation
    assert "\x1b[31mred\x1b[0m\x01 \n" in raw  # R2E-Gym keeps the output of a failing command as it is
    clean = run(sandbox, "execute_bash", ToolSettings(clean_control_characters=True), cmd=cmd).observation
    assert "[STDOUT]\n\nred\ufffd \n" in clean


def test_option_max_observation_chars(sandbox):
    cmd = "head -c 30000 /dev/zero | tr '\\0' a"
    assert len(run(sandbox, "execute_bash", cmd=cmd).observation) > 30000  # R2E-Gym: no cap
    capped = run(sandbox, "execute_bash", ToolSettings(max_observation_chars=1000), cmd=cmd).observation
    assert len(capped) < 1100 and "characters omitted" in capped


def test_blocked_commands_and_search_limit_are_settings(sandbox):
    allowed = run(sandbox, "execute_bash", ToolSettings(blocked_commands=()), cmd="cd pkg && ls")
    assert "[STDOUT]\n\nb.py \n" in allowed.observation
    narrow = run(sandbox, "search", ToolSettings(max_search_files=1), search_term="foo", python_only="")
    root = sandbox.repo_dir  # an empty python_only is R2E-Gym's only way to search every file
    assert narrow.observation.endswith(f'More than 2 files matched for "foo" in {root}. Please narrow your search.\n')


def test_undo_history_is_per_path_as_spelled(sandbox):
    tools = Tools(sandbox)
    tools.run(
        format_action("file_editor", {"command": "str_replace", "path": "a.py", "old_str": "y = 2", "new_str": "y = 3"})
    )
    other = tools.run(format_action("file_editor", {"command": "undo_edit", "path": f"{sandbox.repo_dir}/a.py"}))
    assert other.observation.endswith(f"ERROR: No previous edits found for {sandbox.repo_dir}/a.py to undo.\n")
    same = tools.run(format_action("file_editor", {"command": "undo_edit", "path": "./a.py"}))
    assert same.observation.startswith("Execution output of [file_editor]:\nLast edit to a.py undone successfully.")
    with open(f"{sandbox.repo_dir}/a.py") as fh:
        assert fh.read() == "x = 1\ny = 2\nz = 3\n"


def test_file_editor_without_path_keeps_r2e_gyms_last_line(sandbox):
    # R2E-Gym prints a traceback through the image's pathlib first; that part depends on the image
    result = run(sandbox, "file_editor", command="view")
    assert result.observation == (
        "Execution output of [file_editor]:\nERROR: Unhandled exception: expected str, "
        "bytes or os.PathLike object, not NoneType\n"
    )


def test_local_file_editor_is_confined_to_the_episode(sandbox):
    result = run(sandbox, "file_editor", command="view", path="/etc/hostname.py")
    assert result.error and "outside the sandbox" in result.observation


def test_a_symlink_out_of_the_repository_never_reaches_the_sandbox(tmp_path):
    from trainer.environments.swe.image import task_archive
    from trainer.environments.swe.sandbox import SandboxError

    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    repo, tests = tmp_path / "repo", tmp_path / "hidden"
    repo.mkdir()
    tests.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    (repo / "inside.py").symlink_to("a.py")  # a link within the repository is kept, as a link
    task = SWETask(
        task_id="t",
        docker_image="none",
        problem_statement="p",
        expected={"t.py::t": "PASSED"},
        repo_path=repo,
        hidden_tests_path=tests,
    )
    backend = LocalBackend()
    try:
        backend.start(task)
        assert os.readlink(f"{backend.repo_dir}/inside.py") == "a.py"
        (repo / "passwd").symlink_to(secret)  # now one that leads out of it
        with pytest.raises(SandboxError, match=r"task 't' repo_path: .*passwd is a symlink to .*secret.txt"):
            backend.start(task)
        with pytest.raises(ValueError, match=r"passwd is a symlink"):
            task_archive(task)
        (repo / "passwd").unlink()
        (tests / "dangling").symlink_to(tmp_path / "nowhere")
        with pytest.raises(SandboxError, match=r"hidden_tests_path: .*dangling is a symlink"):
            backend.start(task)
    finally:
        backend.close()
