"""The swe tools: R2E-Gym's action format, observation strings, truncation, and each tool's behaviour.

Tool behaviour runs for real on the local backend (a temporary copy of a small repository written here), so the
expected strings below are R2E-Gym's formats filled in by hand.
"""
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.environments.swe.local_backend import LocalBackend
from trainer.environments.swe.sandbox import OutputCapture
from trainer.environments.swe.tasks import SWETask
from trainer.environments.swe.tools import (FINISHED, NO_CALL_MESSAGE, ActionParseError, ToolSettings, Tools,
                                            clip_chars, format_action, parse_action, sanitize, truncate_lines)

# ----------------------------------------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------------------------------------


def test_parse_multiline_values_are_stripped():
    text = ("Let me fix it.\n<function=file_editor>\n  <parameter=command>str_replace</parameter>\n"
            "  <parameter=path>/testbed/a.py</parameter>\n  <parameter=old_str>\n    x = 1\n</parameter>\n"
            "  <parameter=new_str>\n    x = 2\n</parameter>\n</function>")
    action = parse_action(text)
    assert action.name == "file_editor"
    # R2E-Gym strips every value: the leading indentation of old_str/new_str goes on both sides.
    assert action.params == {"command": "str_replace", "path": "/testbed/a.py", "old_str": "x = 1", "new_str": "x = 2"}
    assert action.n_calls == 1


def test_parse_tolerates_missing_function_close():
    action = parse_action("<function=execute_bash>\n<parameter=cmd>ls -la</parameter>")
    assert (action.name, action.params) == ("execute_bash", {"cmd": "ls -la"})


def test_parse_executes_only_the_first_call():
    text = format_action("execute_bash", {"cmd": "ls"}) + format_action("finish", {"command": "submit"})
    action = parse_action(text)
    assert (action.name, action.params, action.n_calls) == ("execute_bash", {"cmd": "ls"}, 2)


def test_parse_value_may_contain_tags_that_are_not_parameters():
    action = parse_action("<function=file_editor><parameter=file_text><div>x</div> a<b</parameter></function>")
    assert action.params == {"file_text": "<div>x</div> a<b"}


@pytest.mark.parametrize("text, message", [
    ("<function=execute_bash><parameter=cmd>ls</function>", "not closed"),
    ("<function=execute_bash><parameter=cmd>a</parameter><parameter=cmd>b</parameter></function>", "twice"),
    ("<function=bad name!><parameter=cmd>a</parameter></function>", "invalid function name"),
    ("<function=execute_bash><parameter=c md>a</parameter></function>", "invalid parameter name"),
])
def test_parse_malformed_calls(text, message):
    with pytest.raises(ActionParseError, match=message) as info:
        parse_action(text)
    assert not info.value.no_call


def test_parse_no_call():
    with pytest.raises(ActionParseError) as info:
        parse_action("I will now look at the file.")
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
@given(lines=st.lists(st.text(st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                              max_size=5), max_size=60),
       keep=st.integers(1, 10))
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
# the tools on a real local sandbox
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture
def sandbox(tmp_path):
    repo = tmp_path / "fixture"
    (repo / "pkg").mkdir(parents=True)
    (repo / "a.py").write_text("x = 1\ny = 2\nz = 3\n")
    (repo / "pkg" / "b.py").write_text("def foo():\n    return 'foo'\n")
    (repo / "notes.txt").write_text("foo in a text file\n")
    (repo / ".hidden.py").write_text("foo = 'hidden'\n")
    tests = tmp_path / "hidden"
    tests.mkdir()
    task = SWETask(task_id="t", docker_image="none", problem_statement="p", expected={"t.py::t": "PASSED"},
                   repo_path=repo, hidden_tests_path=tests)
    backend = LocalBackend()
    backend.start(task)
    yield backend
    backend.close()


def run(backend, name, settings=None, **params):
    return Tools(backend, settings).run(format_action(name, params))


def test_view_file_exact(sandbox):
    path = f"{sandbox.repo_dir}/a.py"
    result = run(sandbox, "file_editor", command="view", path=path)
    assert result.observation == ("Execution output of [file_editor]:\n"
                                  f"Here's the result of running `cat -n` on the file: {path}:\n"
                                  "     1 x = 1\n     2 y = 2\n     3 z = 3")
    assert not (result.invalid or result.error or result.done)


def test_view_range_and_bad_range(sandbox):
    path = f"{sandbox.repo_dir}/a.py"
    assert run(sandbox, "file_editor", command="view", path=path, view_range="[2, -1]").observation.endswith(
        "cat -n` on the file: " + path + ":\n     2 y = 2\n     3 z = 3")
    bad = run(sandbox, "file_editor", command="view", path=path, view_range="[3, 2]")
    assert "ERROR: Invalid view_range [3, 2]: end must be >= start and <= 3" in bad.observation
    assert bad.error and not bad.invalid
    garbage = run(sandbox, "file_editor", command="view", path=path, view_range="two lines")
    assert garbage.invalid


def test_view_directory_sorted_without_hidden(sandbox):
    root = sandbox.repo_dir
    result = run(sandbox, "file_editor", command="view", path=root)
    assert result.observation == ("Execution output of [file_editor]:\n"
                                  f"Here's the files and directories up to 2 levels deep in {root}, excluding hidden:\n"
                                  f"{root}\n{root}/a.py\n{root}/notes.txt\n{root}/pkg\n{root}/pkg/b.py")


def test_concise_view_elides_long_function_bodies(sandbox):
    path = f"{sandbox.repo_dir}/long.py"
    body = "".join(f"    v{i} = {i}\n" for i in range(5))
    Tools(sandbox).run(format_action("file_editor", {"command": "create", "path": path,
                                                     "file_text": f"def f():\n{body}    return v0\n\nX = 1"}))
    out = run(sandbox, "file_editor", command="view", path=path, concise="true").observation
    # body = lines 2..7 (5 assignments + return): 6 lines >= 4, so elided.
    assert "Here is a condensed view for file:" in out
    # kept: line 1, the note at line 2, the blank line 8 and line 9
    assert "     1 def f():\n     2 ... eliding lines 2-7 ...\n     8 \n     9 X = 1" in out


def test_create_then_refuse_overwrite(sandbox):
    path = f"{sandbox.repo_dir}/new.py"
    result = run(sandbox, "file_editor", command="create", path=path, file_text="a\nb")
    assert result.observation == (f"Execution output of [file_editor]:\nFile created at {path}. "
                                  f"Here's the result of running `cat -n` on {path}:\n     1\ta\n     2\tb\n"
                                  "Review the file and make sure that it is as expected. Edit the file if necessary.")
    with open(path) as fh:
        assert fh.read() == "a\nb"
    again = run(sandbox, "file_editor", command="create", path=path, file_text="c")
    assert again.observation.endswith(f"ERROR: File already exists at: {path}. Cannot overwrite with 'create'.")
    assert again.error


def test_str_replace_unique_none_and_multiple(sandbox):
    path = f"{sandbox.repo_dir}/a.py"
    tools = Tools(sandbox)
    ok = tools.run(format_action("file_editor", {"command": "str_replace", "path": path,
                                                 "old_str": "y = 2", "new_str": "y = 20"}))
    # replacement on line index 1; snippet from max(0, 1-4)=0 to 1+4+0=5 -> the whole 4-element split.
    assert ok.observation == (f"Execution output of [file_editor]:\nThe file {path} has been edited. "
                              f"Here's the result of running `cat -n` on a snippet of {path}:\n"
                              "     1\tx = 1\n     2\ty = 20\n     3\tz = 3\n     4\t\n"
                              "Review the changes and make sure they are as expected. "
                              "Edit the file again if necessary.")
    with open(path) as fh:
        assert fh.read() == "x = 1\ny = 20\nz = 3\n"
    none = tools.run(format_action("file_editor", {"command": "str_replace", "path": path, "old_str": "q = 9"}))
    assert none.observation.endswith(f"ERROR: No occurrences of 'q = 9' found in {path} for replacement.")
    many = tools.run(format_action("file_editor", {"command": "str_replace", "path": path, "old_str": " = "}))
    assert many.observation.endswith(f"ERROR: Multiple occurrences of '=' found in {path}. "
                                     "Please ensure it is unique before using str_replace.")  # " = " stripped
    assert none.error and many.error
    # and undo restores the text before the successful edit, then has nothing left to undo
    undo = tools.run(format_action("file_editor", {"command": "undo_edit", "path": path}))
    assert undo.observation.startswith(f"Execution output of [file_editor]:\nLast edit to {path} undone successfully.")
    with open(path) as fh:
        assert fh.read() == "x = 1\ny = 2\nz = 3\n"
    empty = tools.run(format_action("file_editor", {"command": "undo_edit", "path": path}))
    assert empty.observation.endswith(f"ERROR: No previous edits found for {path} to undo.")


def test_insert_and_range_check(sandbox):
    path = f"{sandbox.repo_dir}/a.py"
    result = run(sandbox, "file_editor", command="insert", path=path, insert_line="1", new_str="w = 0")
    assert "The file " + path + " has been edited." in result.observation
    with open(path) as fh:
        assert fh.read() == "x = 1\nw = 0\ny = 2\nz = 3\n"
    # the file splits into 5 pieces on "\n" (4 lines + the empty tail), so valid lines are 0..5
    bad = run(sandbox, "file_editor", command="insert", path=path, insert_line="9", new_str="q")
    assert bad.observation.endswith("ERROR: Invalid insert_line 9. Must be in [0, 5].")
    nan = run(sandbox, "file_editor", command="insert", path=path, insert_line="one", new_str="q")
    assert nan.invalid


@pytest.mark.parametrize("params, message", [
    ({"path": "/x"}, "Missing required parameter 'command' for file_editor."),
    ({"command": "delete", "path": "/x"}, "Unrecognized command 'delete'."),
    ({"command": "view"}, "Missing required parameter 'path' for file_editor."),
    ({"command": "create", "path": "/x"}, "Missing required parameter 'file_text' for 'create'."),
    ({"command": "str_replace", "path": "/x"}, "Missing required parameter 'old_str' for 'str_replace'."),
    ({"command": "view", "path": "/x", "colour": "red"}, "Unknown parameter(s) for file_editor: colour."),
])
def test_file_editor_invalid_calls(sandbox, params, message):
    result = run(sandbox, "file_editor", **params)
    assert result.invalid and not result.error
    assert message in result.observation


def test_missing_path_and_relative_path(sandbox):
    missing = run(sandbox, "file_editor", command="view", path=f"{sandbox.repo_dir}/nope.py")
    assert missing.observation.endswith(f"ERROR: The path '{sandbox.repo_dir}/nope.py' does not exist.")
    assert missing.error
    relative = run(sandbox, "file_editor", command="view", path="pkg/b.py")
    assert f"on the file: {sandbox.repo_dir}/pkg/b.py:" in relative.observation


def test_local_file_editor_is_confined_to_the_episode(sandbox):
    result = run(sandbox, "file_editor", command="view", path="/etc/hostname")
    assert result.error and "outside the sandbox" in result.observation


def test_a_symlink_out_of_the_repository_never_reaches_the_sandbox(tmp_path):
    from trainer.environments.swe.sandbox import SandboxError
    from trainer.environments.swe.image import task_archive

    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    repo, tests = tmp_path / "repo", tmp_path / "hidden"
    repo.mkdir()
    tests.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    (repo / "inside.py").symlink_to("a.py")  # a link within the repository is kept, as a link
    task = SWETask(task_id="t", docker_image="none", problem_statement="p", expected={"t.py::t": "PASSED"},
                   repo_path=repo, hidden_tests_path=tests)
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


def test_search_directory_exact(sandbox):
    root = sandbox.repo_dir
    result = run(sandbox, "search", search_term="foo")
    # pkg/b.py has "foo" on 2 lines; notes.txt is not .py; .hidden.py is hidden.
    assert result.observation == ("Execution output of [search]:\n"
                                  f'Found 2 matches for "foo" in {root}:\n./pkg/b.py (2 matches)\n'
                                  f'End of matches for "foo" in {root}')
    everything = run(sandbox, "search", search_term="foo", python_only="false")
    assert "Found 3 matches" in everything.observation and "./notes.txt (1 matches)" in everything.observation
    assert run(sandbox, "search", search_term="nowhere").observation.endswith(
        f'No matches found for "nowhere" in {root}')
    narrow = run(sandbox, "search", ToolSettings(max_search_files=1), search_term="foo", python_only="false")
    assert narrow.observation.endswith(f'More than 2 files matched for "foo" in {root}. Please narrow your search.')


def test_search_file_and_missing_directory(sandbox):
    path = f"{sandbox.repo_dir}/pkg/b.py"
    result = run(sandbox, "search", search_term="return", path=path)
    assert result.observation == f'Execution output of [search]:\nMatches for "return" in {path}:\n2:    return \'foo\''
    gone = run(sandbox, "search", search_term="x", path="missing_dir")
    assert gone.error
    assert f"Directory '{sandbox.repo_dir}/missing_dir' not found or not a directory." in gone.observation
    assert run(sandbox, "search", path="pkg").invalid


def test_execute_bash_success_and_failure_strings(sandbox):
    ok = run(sandbox, "execute_bash", cmd="echo hi; echo warn >&2")
    assert ok.observation == "Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\n\nhi\n\n[STDERR]\n\nwarn"
    assert (ok.exit_code, ok.nonzero_exit, ok.error) == (0, False, False)
    bad = run(sandbox, "execute_bash", cmd="echo oops >&2; exit 3")
    assert bad.observation == ("Exit code: Error: Exit code 3\nExecution output of [execute_bash]:\n"
                               "Error executing command:\n\n[STDOUT]\n\n\n\n[STDERR]\n\noops")
    assert (bad.exit_code, bad.nonzero_exit, bad.error, bad.invalid) == (3, True, False, False)
    alias = run(sandbox, "execute_bash", command="pwd")
    assert f"[STDOUT]\n\n{sandbox.repo_dir}\n" in alias.observation


def test_execute_bash_truncates_to_40_plus_40_lines(sandbox):
    lines = run(sandbox, "execute_bash", cmd="seq 1 100").observation.splitlines()
    # tool output lines: "[STDOUT]", "", "1".."100", "", "[STDERR]", "" = 105 > 80, so keep 40 + 40:
    # head = "[STDOUT]", "", "1".."38"; tail = "64".."100" (37 lines), "", "[STDERR]", "".
    assert lines[:2] == ["Exit code: 0", "Execution output of [execute_bash]:"]
    assert lines[2:42] == ["[STDOUT]", ""] + [str(i) for i in range(1, 39)]
    assert lines[42:45] == ["-" * 50, "<Observation truncated in middle for saving context>", "-" * 50]
    assert lines[45:] == [str(i) for i in range(64, 101)] + ["", "[STDERR]"]


def test_execute_bash_timeout_kills_the_command(sandbox):
    started = time.monotonic()
    result = run(sandbox, "execute_bash", ToolSettings(command_timeout_s=1), cmd="sleep 30; echo never")
    assert time.monotonic() - started < 5
    assert result.observation == ("Exit code: -1\nExecution output of [execute_bash]:\n"
                                  "The command took too long to execute (>1s)")
    assert result.timed_out and result.error and result.exit_code == -1


def test_background_processes_do_not_outlive_the_command(sandbox):
    result = run(sandbox, "execute_bash", cmd="sleep 300 & echo $!")
    pid = int(result.observation.split("[STDOUT]\n\n")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_blocked_missing_and_unknown(sandbox):
    blocked = run(sandbox, "execute_bash", cmd="pip install requests")
    assert blocked.invalid and blocked.observation == (
        "Exit code: Error: Exit code 1\nExecution output of [execute_bash]:\n"
        "Bash command 'pip' is not allowed. Please use a different command or tool.")
    missing = run(sandbox, "execute_bash")
    assert missing.invalid and "Missing required parameter 'cmd' for execute_bash." in missing.observation
    unknown = run(sandbox, "delete_repo", path="/")
    assert unknown.invalid and unknown.tool == "delete_repo"
    assert unknown.observation.startswith("Execution output of [delete_repo]:\nInvalid Action:")


def test_finish_submit_and_no_call(sandbox):
    for name in ("finish", "submit"):
        result = run(sandbox, name, command="submit")
        assert (result.observation, result.done, result.tool) == (FINISHED, True, "finish")
    none = Tools(sandbox).run("I am done, thanks!")
    assert none.observation == NO_CALL_MESSAGE and none.invalid and not none.done
    malformed = Tools(sandbox).run("<function=execute_bash><parameter=cmd>ls</function>")
    assert malformed.invalid
    assert malformed.observation.startswith("Execution output of [execute_bash]:\nERROR: Malformed")
