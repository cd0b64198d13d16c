"""Records R2E-Gym's own observation strings into `observations.json`, the reference of tests/unit/test_swe_tools.py.

Usage: python tests/data/r2e_tools/record.py R2E_GYM_CHECKOUT [OUT.json]

Nothing of R2E-Gym is copied into this repository: this script runs R2E-Gym's code from a checkout given on the
command line (R2E-Gym/R2E-Gym at 69bc953542b428d1e4c8a59ce3ea1a32e50ef0f0 for the stored file) and stores only the
strings it produces. What runs is R2E-Gym's, unchanged:

- the four tool scripts `src/r2egym/agenthub/tools/{execute_bash,file_editor,search,finish}.py`, installed without
  `.py` in a bin folder first on PATH as `RepoEnv.add_commands` installs them in /usr/local/bin, run by this Python;
- `Agent.parse_response` (agent/agent.py), `RepoEnv.run_action` / `step` (environment/env.py),
  `DockerRuntime.run` (runtime/docker.py), `Action` and `Observation`, taken from the checkout's source; only the
  container is replaced: `exec_run` runs its `["/bin/sh", "-c", "timeout T TOOL ARGS "]` as a local subprocess in
  the fixture repository, stdout and stderr in one stream as a non-tty `docker exec` gives them;
- the glue of `Agent.run` around a step (`obs = str(e)` when the step raises), written out below.

Three things differ from a container, and are undone here: the fixture lives in a tmpfs folder and its entries are
created in reverse order so that the file system lists them sorted (tmpfs lists the newest first; R2E-Gym's
listings and searches follow the file system's order, the project's are sorted), the repository's path is stored
as `@REPO@`, and the bin folder in tracebacks as /usr/local/bin; the editor's state file is moved from
/var/tmp/editor_state.json into the temporary folder.
"""
from __future__ import annotations

import ast
import concurrent.futures
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
TOOLS = ("execute_bash", "file_editor", "search", "finish")


def call(name: str, params: dict | None = None) -> str:
    """A call as R2E-Gym's prompt asks for it."""
    body = "".join(f"<parameter={key}>{value}</parameter>\n" for key, value in (params or {}).items())
    return f"<function={name}>\n{body}</function>"


LONG_PY = "\n".join(
    ['"""A module long enough for the automatic condensed view (more than 110 lines)."""', "", "",
     "class Shape:", '    """A shape.', "", "    It has an area and a name; this docstring is", "    long enough",
     "    to be elided.", '    """', "", "    def __init__(self, name):", "        self.name = name", "",
     "    def area(self):", "        total = 0", "        for part in self.parts():", "            total += part",
     "        return total", "", "    def parts(self):", "        def helper(x):", "            y = x * 2",
     "            z = y + 1", "            w = z - 1", "            return w", "        return [helper(1), helper(2)]",
     ""]
    + [f"def f{i}(value):\n    return value + {i}\n" for i in range(30)]
    + ["def g(value):", "    a = value", "    b = a + 1", "    c = b + 1", "    d = c + 1", "    return d", ""])

FIXTURE = {
    "a.py": "x = 1\ny = 2\nz = 3\n",
    "broken.py": "def f(:\n    return 1\n",
    "crlf.py": "a = 1\r\nb = 2\r\n",
    "long.py": LONG_PY,
    "notes.txt": "foo in a text file\n",
    ".hidden.py": "foo = 'hidden'\n",
    "pkg/__init__.py": "",
    "pkg/b.py": "def foo():\n    return 'foo'\n",
}
"""The repository every case runs in (one repository, cases in order: the edits build on each other)."""

R = "@REPO@"
CASES = [
    # parsing (Agent.parse_response, Action.from_string) and the agent loop
    ("no_call", "I will look at the repository first."),
    ("no_function_close", "<function=execute_bash>\n<parameter=cmd>ls</parameter>"),
    ("empty_function_name", "<function=></function>"),
    ("unknown_tool", call("delete_repo", {"path": "/"})),
    ("submit_is_not_a_tool", call("submit", {"command": "submit"})),
    ("first_of_two_calls", call("execute_bash", {"cmd": "echo one"}) + "\n"
     + call("execute_bash", {"cmd": "echo two"})),
    ("thought_and_indented_call", "Let me list.\n<function=execute_bash>\n  <parameter=cmd>\n  echo hi\n"
                                  "  </parameter>\n</function>\nDone."),
    ("duplicate_parameter_last_wins", "<function=execute_bash><parameter=cmd>echo a</parameter>"
                                      "<parameter=cmd>echo b</parameter></function>"),
    # execute_bash
    ("bash_stdout_and_stderr", call("execute_bash", {"cmd": "echo hi; echo warn >&2"})),
    ("bash_nonzero_exit", call("execute_bash", {"cmd": "echo out; echo oops >&2; exit 3"})),
    ("bash_no_output", call("execute_bash", {"cmd": "true"})),
    ("bash_runs_sh_not_bash", call("execute_bash", {"cmd": "echo $0; [[ 1 == 1 ]] && echo bash"})),
    ("bash_working_directory", call("execute_bash", {"cmd": "pwd"})),
    ("bash_blocked_cd", call("execute_bash", {"cmd": "cd pkg && ls"})),
    ("bash_blocked_pip", call("execute_bash", {"cmd": "pip install requests"})),
    ("bash_40_plus_40_lines", call("execute_bash", {"cmd": "seq 1 100"})),
    ("bash_40_plus_40_lines_failing", call("execute_bash", {"cmd": "seq 1 90; exit 1"})),
    ("bash_ansi_removed_on_success", call("execute_bash", {"cmd": "printf '\\033[31mred\\033[0m\\n'"})),
    ("bash_ansi_kept_on_failure", call("execute_bash", {"cmd": "printf '\\033[31mred\\033[0m\\n'; exit 1"})),
    ("bash_carriage_returns", call("execute_bash", {"cmd": "printf 'a\\rb\\r\\nc\\n'"})),
    ("bash_timeout", call("execute_bash", {"cmd": "sleep 5; echo never"}), 2),
    ("bash_exit_124_reads_as_timeout", call("execute_bash", {"cmd": "exit 124"})),
    ("bash_missing_cmd", call("execute_bash")),
    ("bash_command_instead_of_cmd", call("execute_bash", {"command": "ls"})),
    ("bash_empty_cmd", call("execute_bash", {"cmd": ""})),
    ("bash_unknown_parameter", call("execute_bash", {"cmd": "ls", "timeout_s": "5"})),
    ("bash_abbreviated_parameter", call("execute_bash", {"c": "echo abbreviated"})),
    # file_editor: views
    ("view_py_file", call("file_editor", {"command": "view", "path": f"{R}/a.py"})),
    ("view_relative_path", call("file_editor", {"command": "view", "path": "pkg/b.py"})),
    ("view_dot_relative_path", call("file_editor", {"command": "view", "path": "./a.py"})),
    ("view_range", call("file_editor", {"command": "view", "path": f"{R}/a.py", "view_range": "[2, -1]"})),
    ("view_range_invalid", call("file_editor", {"command": "view", "path": f"{R}/a.py", "view_range": "[3, 2]"})),
    ("view_range_not_numbers", call("file_editor", {"command": "view", "path": f"{R}/a.py",
                                                    "view_range": "two lines"})),
    ("view_directory", call("file_editor", {"command": "view", "path": R})),
    ("view_relative_directory", call("file_editor", {"command": "view", "path": "pkg"})),
    ("view_non_python_file_refused", call("file_editor", {"command": "view", "path": f"{R}/notes.txt"})),
    ("view_missing_file", call("file_editor", {"command": "view", "path": f"{R}/nope.py"})),
    ("view_long_file_condensed", call("file_editor", {"command": "view", "path": f"{R}/long.py"})),
    ("view_long_file_range", call("file_editor", {"command": "view", "path": f"{R}/long.py", "view_range": "[1, 12]"})),
    ("view_concise_short_file", call("file_editor", {"command": "view", "path": f"{R}/pkg/b.py", "concise": "True"})),
    ("view_concise_syntax_error", call("file_editor", {"command": "view", "path": f"{R}/broken.py",
                                                       "concise": "true"})),
    ("view_crlf_file", call("file_editor", {"command": "view", "path": f"{R}/crlf.py"})),
    # search (before any file is created: the listings' order is the file system's in R2E-Gym)
    ("search_directory", call("search", {"search_term": "foo"})),
    ("search_directory_several_files", call("search", {"search_term": "return"})),
    ("search_python_only_false_still_python", call("search", {"search_term": "foo", "python_only": "false"})),
    ("search_no_hits", call("search", {"search_term": "nowhere"})),
    ("search_file", call("search", {"search_term": "return", "path": "pkg/b.py"})),
    ("search_file_regex", call("search", {"search_term": "x.=", "path": f"{R}/a.py"})),
    ("search_file_no_hits", call("search", {"search_term": "nowhere", "path": f"{R}/a.py"})),
    ("search_missing_directory", call("search", {"search_term": "x", "path": "missing_dir"})),
    ("search_missing_term", call("search", {"path": "pkg"})),
    # file_editor: edits
    ("create", call("file_editor", {"command": "create", "path": f"{R}/new.py",
                                    "file_text": "def g():\n\treturn 1\n"})),
    ("create_existing", call("file_editor", {"command": "create", "path": f"{R}/new.py", "file_text": "x"})),
    ("create_without_file_text", call("file_editor", {"command": "create", "path": f"{R}/new2.py"})),
    ("create_with_linting_refused", call("file_editor", {"command": "create", "path": f"{R}/lint.py",
                                                         "file_text": "def f(:", "enable_linting": "true"})),
    ("str_replace_unique", call("file_editor", {"command": "str_replace", "path": f"{R}/a.py", "old_str": "y = 2",
                                                "new_str": "y = 20"})),
    ("str_replace_not_found", call("file_editor", {"command": "str_replace", "path": f"{R}/a.py", "old_str": "q = 9",
                                                   "new_str": "q = 10"})),
    ("str_replace_multiple", call("file_editor", {"command": "str_replace", "path": f"{R}/a.py", "old_str": " = ",
                                                  "new_str": "="})),
    ("str_replace_value_like_an_option", call("file_editor", {"command": "str_replace", "path": f"{R}/a.py",
                                                              "old_str": "--verbose", "new_str": "-v"})),
    ("str_replace_on_directory", call("file_editor", {"command": "str_replace", "path": f"{R}/pkg", "old_str": "a",
                                                      "new_str": "b"})),
    ("insert", call("file_editor", {"command": "insert", "path": f"{R}/a.py", "insert_line": "1", "new_str": "w = 0"})),
    ("insert_line_out_of_range", call("file_editor", {"command": "insert", "path": f"{R}/a.py", "insert_line": "9",
                                                      "new_str": "q"})),
    ("insert_line_not_a_number", call("file_editor", {"command": "insert", "path": f"{R}/a.py", "insert_line": "one",
                                                      "new_str": "q"})),
    ("insert_without_insert_line", call("file_editor", {"command": "insert", "path": f"{R}/a.py", "new_str": "q"})),
    ("undo_edit_insert", call("file_editor", {"command": "undo_edit", "path": f"{R}/a.py"})),
    ("undo_edit_str_replace", call("file_editor", {"command": "undo_edit", "path": f"{R}/a.py"})),
    ("undo_edit_nothing_left", call("file_editor", {"command": "undo_edit", "path": f"{R}/a.py"})),
    ("undo_edit_other_spelling", call("file_editor", {"command": "undo_edit", "path": "new.py"})),
    ("file_editor_missing_command", call("file_editor", {"path": f"{R}/a.py"})),
    ("file_editor_unrecognized_command", call("file_editor", {"command": "delete", "path": f"{R}/a.py"})),
    ("file_editor_unknown_parameter", call("file_editor", {"command": "view", "path": f"{R}/a.py", "colour": "red"})),
    ("finish", call("finish", {"command": "submit"})),
]
"""(id, action text[, timeout seconds]) in the order they run; the timeout is Agent.run's max_exec_time (90)."""


def _method(path: Path, cls: str, name: str) -> str:
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return textwrap.dedent(ast.get_source_segment(source, item, padded=True))
    raise LookupError(f"{cls}.{name} not in {path}")


def _write_fixture(repo: Path) -> None:
    """Create the fixture newest-last in reverse order, so that tmpfs lists every folder sorted."""
    for rel in sorted(FIXTURE, reverse=True):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    for rel in sorted(FIXTURE, reverse=True):
        (repo / rel).write_bytes(FIXTURE[rel].encode())
    for folder in [repo] + [p for p in repo.rglob("*") if p.is_dir()]:
        if os.listdir(folder) != sorted(os.listdir(folder)):
            raise SystemExit(f"{folder} does not list sorted ({os.listdir(folder)}): record on a tmpfs (/dev/shm)")


def record(checkout: Path) -> dict:
    src = checkout / "src"
    hub = src / "r2egym" / "agenthub"
    sys.path.insert(0, str(src))
    from r2egym.agenthub.action import Action  # noqa: E402  (R2E-Gym's, from the checkout)
    from r2egym.agenthub.observation import Observation  # noqa: E402

    work = Path(tempfile.mkdtemp(prefix="r2e-record-", dir="/dev/shm"))
    try:
        repo, bin_dir = work / "testbed", work / "bin"
        repo.mkdir()
        bin_dir.mkdir()
        _write_fixture(repo)
        for tool in TOOLS:  # RepoEnv.add_commands: the script, without .py, executable, on PATH
            text = (hub / "tools" / f"{tool}.py").read_text()
            text = re.sub(r"\A#!.*", f"#!{sys.executable}", text)
            text = text.replace('"/var/tmp/editor_state.json"', repr(str(work / "editor_state.json")))
            (bin_dir / tool).write_text(text)
            (bin_dir / tool).chmod(0o755)

        def exec_run(cmd, workdir, stdout, stderr, environment):
            env = {"PATH": f"{bin_dir}:{environment['PATH']}:/usr/bin:/bin", "HOME": str(work),
                   "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
            done = subprocess.run(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
            return SimpleNamespace(output=done.stdout, exit_code=done.returncode)

        namespace = {"re": re, "time": time, "concurrent": concurrent, "Action": Action, "Observation": Observation,
                     "Dict": Dict, "Any": Any, "Tuple": Tuple, "List": List, "Optional": Optional,
                     "CMD_TIMEOUT": 120,
                     "DOCKER_PATH": "/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:/usr/local/sbin:"
                                    "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        for path, cls, name in ((hub / "environment" / "env.py", "RepoEnv", "run_action"),
                                (hub / "environment" / "env.py", "RepoEnv", "step"),
                                (hub / "environment" / "env.py", "RepoEnv", "calculate_reward"),
                                (hub / "runtime" / "docker.py", "DockerRuntime", "run"),
                                (hub / "agent" / "agent.py", "Agent", "parse_response")):
            exec(_method(path, cls, name), namespace)  # noqa: S102  (R2E-Gym's method, unchanged)
        logger = logging.getLogger("r2e-record")
        logger.disabled = True
        runtime = type("DockerRuntime", (), {"run": namespace["run"]})()
        runtime.container, runtime.repo_path, runtime.logger = SimpleNamespace(exec_run=exec_run), str(repo), logger
        env = type("RepoEnv", (), {"run_action": namespace["run_action"], "step": namespace["step"],
                                   "calculate_reward": namespace["calculate_reward"]})()
        env.runtime, env.logger, env.done = runtime, logger, False
        env.commands = [SimpleNamespace(name=tool) for tool in TOOLS]
        agent = type("Agent", (), {"parse_response": namespace["parse_response"]})()

        cases = []
        for case in CASES:
            case_id, text, timeout = (*case, 90)[:3]
            concrete = text.replace(R, str(repo))
            thought, action = agent.parse_response(concrete)
            try:  # Agent.run around env.step
                obs, reward, done, info = env.step(action, timeout=timeout)
            except Exception as e:  # noqa: BLE001
                obs = str(e)
            observation = str(obs).replace(str(repo), R).replace(f"{bin_dir}/", "/usr/local/bin/")
            cases.append({"id": case_id, "action": text, "timeout": timeout, "observation": observation})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return {"source": {"repository": "R2E-Gym/R2E-Gym",
                       "commit": commit.stdout.strip() or "unknown",
                       "recorded_with": "tests/data/r2e_tools/record.py",
                       "python": sys.version.split()[0], "shell": os.path.realpath("/bin/sh")},
            "fixture": FIXTURE, "cases": cases}


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    out = Path(sys.argv[2]) if len(sys.argv) == 3 else HERE / "observations.json"
    out.write_text(json.dumps(record(Path(sys.argv[1]).resolve()), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
