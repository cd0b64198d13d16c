"""The hardened grading: pytest run through `report_launcher.py`, its signed report read by `read_report`.

The reference for an honest run is R2E-Gym's own reading of the same run's `-rA` log (`parse_pytest_report`, itself
checked against a hand-parsed log in test_swe_grading.py): on real pytest runs of a zoo of outcomes the two agree
test for test, except where the log's text lies. The refusals are checked on hand-built reports; the launcher's
observations against `tamper.dynamic_flags`, which must find nothing in an honest run (pytest's own doings, the
repository's conftest and plugins) and must find code of a changed file patching pytest.
"""

import hashlib
import hmac
import json
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.environments.swe.grading import LAUNCHER_PATH, parse_pytest_report, pytest_command, read_report
from trainer.environments.swe.tamper import dynamic_flags


def repository_files(repo) -> set[str]:
    """Every file under `repo`, relative: as if the agent had changed all of them."""
    return {p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()}


KEY = b"0123456789abcdef" * 4

ZOO = """
import unittest
import pytest
from pkg import inc

def test_pass(): assert inc(1) == 2
def test_fail(): assert inc(1) == 3
def test_says_passed(): raise RuntimeError("PASSED")

@pytest.fixture
def broken_setup(): raise ValueError("setup")
def test_setup_error(broken_setup): pass

@pytest.fixture
def broken_teardown():
    yield
    raise ValueError("teardown")
def test_teardown_error(broken_teardown): pass
def test_fail_and_teardown_error(broken_teardown): assert 0

@pytest.mark.skip(reason="no")
def test_skip(): pass
@pytest.mark.xfail
def test_xfail(): assert 0
@pytest.mark.xfail
def test_xpass(): pass
@pytest.mark.xfail(strict=True)
def test_xpass_strict(): pass
@pytest.mark.parametrize("v", [1, 2, "a - b"])
def test_param(v): assert v != 2

class TestFixtures:
    def test_builtin_fixtures(self, tmp_path, monkeypatch, capsys, caplog):
        monkeypatch.setattr("pkg.inc", lambda x: x)
        print("out")
        assert (tmp_path / "x").parent == tmp_path

class Unit(unittest.TestCase):
    def test_ok(self): self.assertEqual(inc(0), 1)
    def test_bad(self): self.assertEqual(inc(0), 2)
    @unittest.skip("s")
    def test_skipped(self): pass
"""


def run_launched(repo, key=KEY, python=sys.executable):
    """Run the hidden tests of `repo` through the launcher; (process, report bytes or None)."""
    channel = repo / "channel"
    channel.mkdir(exist_ok=True)
    (channel / "key").write_bytes(key)
    words = " ".join(shlex.quote(str(p)) for p in (LAUNCHER_PATH, channel / "key", channel / "report"))
    command = pytest_command(shlex.quote(python), shlex.quote(str(repo)), words)
    proc = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120)
    report = (channel / "report").read_bytes() if (channel / "report").exists() else None
    return proc, report


def make_repo(tmp_path, tests: dict[str, str], package="def inc(x):\n    return x + 1\n"):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(package)
    (tmp_path / "r2e_tests").mkdir()
    for name, text in tests.items():
        (tmp_path / "r2e_tests" / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_an_honest_run_reads_as_r2e_gym_reads_its_log(tmp_path):
    repo = make_repo(tmp_path, {"test_zoo.py": ZOO, "test_other.py": "def test_four(): pass\n"})
    proc, report = run_launched(repo)
    by_log = parse_pytest_report((proc.stdout + b"\n" + proc.stderr).decode())
    reading = read_report(report, KEY, proc.returncode)
    assert reading.problem is None and proc.returncode == 1
    assert not (repo / "channel" / "key").exists()  # the launcher deleted its key before pytest started
    # R2E-Gym's substring rule reads the failure "RuntimeError: PASSED" as a pass; the report does not
    assert by_log.pop("test_says_passed") == "PASSED" and reading.statuses.pop("test_says_passed") == "FAILED"
    assert reading.statuses == by_log
    # and by hand: a teardown error after a pass is ERROR, after a failure FAILED (the summary's order);
    # skips, xfails and non-strict xpasses are dropped; a strict xpass fails; the param id is cut at " - "
    assert by_log["test_teardown_error"] == "ERROR" and by_log["test_fail_and_teardown_error"] == "FAILED"
    assert by_log["test_setup_error"] == "ERROR" and by_log["test_xpass_strict"] == "FAILED"
    assert {"test_skip", "test_xfail", "test_xpass", "Unit.test_skipped"}.isdisjoint(by_log)
    assert by_log["test_param[a"] == "PASSED" and by_log["test_param[2]"] == "FAILED"
    assert by_log["TestFixtures.test_builtin_fixtures"] == "PASSED" and by_log["Unit.test_bad"] == "FAILED"
    # nothing pytest does by itself is a flag, even with every file of the repository counted as changed
    assert dynamic_flags(reading.observations, repository_files(repo), testbed=str(repo)) == []


def test_a_collection_error_reads_as_the_empty_name(tmp_path):
    repo = make_repo(tmp_path, {"test_a.py": "def test_a(): pass\n", "test_b.py": "import no_such_module\n"})
    proc, report = run_launched(repo)
    reading = read_report(report, KEY, proc.returncode)
    assert reading.problem is None and reading.statuses == {"": "ERROR"}
    assert reading.statuses == parse_pytest_report(proc.stdout.decode())


SHADOW = """import importlib.util, os, sys, sysconfig
import _pytest.python
_pytest.python.Function.runtest = lambda self: None
spec = importlib.util.spec_from_file_location("cmd", os.path.join(sysconfig.get_paths()["stdlib"], "cmd.py"))
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
sys.modules["cmd"] = real
"""
"""A repository module shadowing `cmd`, which pytest imports (for pdb) after putting the repository on sys.path and
before the first test module: it patches pytest, then puts the real module in its place."""


def test_a_repository_module_that_pytest_imports_during_start_up_cannot_patch_it_unseen(tmp_path):
    """pytest itself sees a pass (both readings say 1): only the launcher's observation tells, and it is a flag
    because the code that patched pytest is in a file the agent added."""
    repo = make_repo(tmp_path, {"test_a.py": "from pkg import inc\ndef test_a(): assert inc(1) == 3\n"})
    (repo / "cmd.py").write_text(SHADOW)
    proc, report = run_launched(repo)
    assert parse_pytest_report(proc.stdout.decode()) == {"test_a": "PASSED"}  # the forgery works on pytest itself
    reading = read_report(report, KEY, proc.returncode)
    assert reading.problem is None and reading.statuses == {"test_a": "PASSED"}
    flags = dynamic_flags(reading.observations, {"cmd.py"}, testbed=str(repo))
    assert any("cmd.py" in f and "Function.runtest" in f for f in flags), reading.observations
    # the same change by a file of the original repository (not the agent's) is the repository's own business
    assert dynamic_flags(reading.observations, set(), testbed=str(repo)) == []


def signed(records, key=KEY):
    """A report as the launcher writes it."""
    lines = []
    for seq, record in enumerate(records):
        body = json.dumps(dict(record, seq=seq), sort_keys=True)
        lines.append(json.dumps({"record": body, "mac": hmac.new(key, body.encode(), hashlib.sha256).hexdigest()}))
    return ("\n".join(lines) + "\n").encode()


def without_line(report: bytes, index: int) -> bytes:
    """The report with one of its signed lines removed."""
    lines = report.split(b"\n")
    return b"\n".join(lines[:index] + lines[index + 1 :])


START = {"kind": "start", "pytest": "9", "root": "/testbed/"}
RUN = [
    {"kind": "collected", "nodeids": ["r2e_tests/test_a.py::test_x", "r2e_tests/test_a.py::C::test_y"]},
    {"kind": "report", "nodeid": "r2e_tests/test_a.py::test_x", "when": "setup", "outcome": "passed", "category": ""},
    {
        "kind": "report",
        "nodeid": "r2e_tests/test_a.py::test_x",
        "when": "call",
        "outcome": "passed",
        "category": "passed",
    },
    {
        "kind": "report",
        "nodeid": "r2e_tests/test_a.py::test_x",
        "when": "teardown",
        "outcome": "passed",
        "category": "",
    },
    {
        "kind": "report",
        "nodeid": "r2e_tests/test_a.py::C::test_y",
        "when": "setup",
        "outcome": "passed",
        "category": "",
    },
    {
        "kind": "report",
        "nodeid": "r2e_tests/test_a.py::C::test_y",
        "when": "call",
        "outcome": "failed",
        "category": "failed",
    },
    {
        "kind": "report",
        "nodeid": "r2e_tests/test_a.py::C::test_y",
        "when": "teardown",
        "outcome": "failed",
        "category": "error",
    },
]
FINISH = {"kind": "finish", "exitstatus": 1}


def test_a_hand_built_report_reads_by_hand():
    reading = read_report(signed([START, *RUN, FINISH]), KEY, 1)
    assert reading.problem is None
    assert reading.statuses == {"test_x": "PASSED", "C.test_y": "FAILED"}  # failed after error in the summary
    # a crash at interpreter shutdown, after the signed end, changes nothing
    assert read_report(signed([START, *RUN, FINISH]), KEY, 134) == reading


OBSERVED = [
    {
        "kind": "observed",
        "what": "replaced _pytest.python.Function.runtest",
        "file": "/testbed/pkg/mod.py",
        "origin": "repository",
        "where": "r2e_tests/test_a.py::test_x",
    },
    {
        "kind": "observed",
        "what": "registered a plugin",
        "file": "/testbed/Tests/helper.py",
        "origin": "repository",
        "where": "start-up",
    },
    {
        "kind": "observed",
        "what": "replaced _pytest.config.Config.x",
        "file": "/venv/lib/_pytest/legacypath.py",
        "origin": "interpreter",
        "where": "start-up",
    },
    {
        "kind": "observed",
        "what": "added _pytest.reports.TestReport.outcome",
        "file": "",
        "origin": "other",
        "where": "collection",
    },
]


def test_observations_are_flags_only_when_the_agents_code_or_code_of_no_file_made_them():
    reading = read_report(signed([START, *OBSERVED, *RUN, FINISH]), KEY, 1)
    assert reading.problem is None and [o["what"] for o in reading.observations] == [o["what"] for o in OBSERVED]
    assert dynamic_flags(reading.observations, set()) == [
        "test runner changed: code of no file: added _pytest.reports.TestReport.outcome (collection)"
    ]
    flags = dynamic_flags(reading.observations, {"pkg/mod.py"})
    assert flags[0] == (
        "test runner changed: pkg/mod.py: replaced _pytest.python.Function.runtest (r2e_tests/test_a.py::test_x)"
    )
    assert len(flags) == 2  # the unchanged plugin file and pytest's own patch are not flags


def test_pytest_installed_in_the_repositorys_own_venv_is_not_the_repository(tmp_path):
    """R2E-Gym's images keep the interpreter's environment in /testbed/.venv, pytest included: its modules load
    from under the repository root, and that is not the repository's code running early."""
    import importlib.util

    repo = make_repo(tmp_path, {"test_a.py": "from pkg import inc\ndef test_a(): assert inc(1) == 2\n"})
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(repo / ".venv")], check=True)
    site = next((repo / ".venv" / "lib").glob("python3*")) / "site-packages"
    for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py"):
        origin = Path(importlib.util.find_spec(name).origin)
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, site / name)
        else:
            shutil.copy2(origin, site / origin.name)
        for info in origin.parent.parent.glob(f"{name}-*.dist-info") if origin.name == "__init__.py" else ():
            shutil.copytree(info, site / info.name)
    python = repo / ".venv" / "bin" / "python"
    assert (
        subprocess.run(
            [str(python), "-c", "import _pytest, sys; assert _pytest.__file__.startswith(sys.prefix)"]
        ).returncode
        == 0
    )
    proc, report = run_launched(repo, python=str(python))
    reading = read_report(report, KEY, proc.returncode)
    assert reading.problem is None and reading.statuses == {"test_a": "PASSED"}


@pytest.mark.parametrize(
    "report, exit_code, problem",
    [
        (None, 1, "no report"),
        (b"", 1, "no report"),
        (signed([START, *RUN, FINISH], key=b"another key"), 1, "line 1 of the report is not the launcher's"),
        (signed([START, *RUN, FINISH]) + b'{"record": "{}", "mac": "00"}\n', 1, "line 10 of the report is not"),
        (signed([START, *RUN, FINISH]).replace(b"failed", b"passed", 1), 1, "is not the launcher's"),
        (b"PASSED r2e_tests/test_a.py::test_x\n", 1, "line 1 of the report is not the launcher's"),
        (without_line(signed([START, *RUN, FINISH]), 3), 1, "missing or out of order"),
        (signed([*RUN, FINISH]), 1, "does not begin with the launcher's start"),
        (signed([START, *RUN]), 0, "the process ended (exit code 0) before pytest's session did"),
        (b"[" * 200_000 + b"\n", 1, "line 1 of the report is not the launcher's"),
        (signed([START, *RUN[:-1], FINISH]), 1, "1 collected tests never ran (first: r2e_tests/test_a.py::C::test_y)"),
    ],
)
def test_a_report_that_cannot_be_trusted_is_refused(report, exit_code, problem):
    reading = read_report(report, KEY, exit_code)
    assert reading.statuses == {} and problem in reading.problem


def test_the_grading_is_an_env_option_checked_by_name():
    from trainer.environments.suite import family_config

    assert family_config("swe", {}).grading == "report"
    assert family_config("swe", {"grading": "r2e_gym_log"}).grading == "r2e_gym_log"
    with pytest.raises(ValueError, match="grading"):
        family_config("swe", {"grading": "substring"})


def test_conftest_files_and_pytest_plugins_of_an_honest_suite_are_accepted(tmp_path):
    """Where the test command honours conftest files (R2E-Gym's run_tests.sh does), a root conftest that imports the
    package and registers a plugin of the repository (as Pillow's registers Tests.helper), one in the tests' folder
    and a test module's `pytest_plugins` naming one of pytest's own are read as they are."""
    repo = make_repo(
        tmp_path,
        {
            "conftest.py": "import pytest\n@pytest.fixture\ndef one():\n    return 1\n",
            "test_a.py": "pytest_plugins = ['pytester']\nfrom pkg import inc\n"
            "def test_a(one, pytester): assert inc(one) == 2\n",
        },
    )
    (repo / "conftest.py").write_text(
        "import pkg\nimport pytest\npytest_plugins = ['helpers.plugin']\n@pytest.fixture\ndef two():\n    return 2\n"
    )
    (repo / "helpers").mkdir()
    (repo / "helpers" / "__init__.py").write_text("")
    (repo / "helpers" / "plugin.py").write_text(
        "import pytest\n@pytest.fixture\ndef three():\n    return 3\n"
        "def pytest_configure(config):\n    config.addinivalue_line('markers', 'slow: slow')\n"
    )
    (repo / "r2e_tests" / "test_b.py").write_text("def test_b(two, three): assert two + 1 == three\n")
    (repo / "channel").mkdir()
    (repo / "channel" / "key").write_bytes(KEY)
    proc = subprocess.run(
        [
            sys.executable,
            "-B",
            str(LAUNCHER_PATH),
            str(repo / "channel" / "key"),
            str(repo / "channel" / "report"),
            "-rA",
            "-p",
            "no:cacheprovider",
            "r2e_tests",
        ],
        cwd=repo,
        capture_output=True,
        timeout=120,
    )
    reading = read_report((repo / "channel" / "report").read_bytes(), KEY, proc.returncode)
    assert reading.problem is None, proc.stdout.decode()[-2000:]
    assert reading.statuses == {"test_a": "PASSED", "test_b": "PASSED"}
    # the repository imported early and its plugin registered: seen, and not flags while those files are the
    # original repository's; the agent's change to the plugin would make its registration one
    assert any(o["what"] == "registered a plugin" for o in reading.observations)
    assert dynamic_flags(reading.observations, set(), testbed=str(repo)) == []
    assert dynamic_flags(reading.observations, {"helpers/plugin.py"}, testbed=str(repo))


def test_the_images_own_test_script_runs_through_the_launcher():
    from trainer.environments.swe.docker_backend import GRADER_DIR, runs_pytest, through_launcher

    r2e_gym = ".venv/bin/python -W ignore -m pytest -rA r2e_tests"
    assert through_launcher(r2e_gym) == (
        f".venv/bin/python -W ignore {GRADER_DIR}/launcher.py {GRADER_DIR}/run/key "
        f"{GRADER_DIR}/run/report -rA r2e_tests"
    )
    shipped = pytest_command("python3", "/testbed")
    assert through_launcher(shipped) == pytest_command(
        "python3", "/testbed", " ".join(f"{GRADER_DIR}/{name}" for name in ("launcher.py", "run/key", "run/report"))
    )
    assert runs_pytest(r2e_gym) and not runs_pytest(".venv/bin/python -W ignore r2e_tests/runner.py")


@pytest.mark.parametrize("call", ["feed", "stream_out"])
def test_an_engine_failure_while_grading_is_a_sandbox_error(call, tmp_path):
    """A Docker API error while placing the launcher or reading the report ends the episode with the reason (as a
    SandboxError, which the environment grades 0), not with an exception out of env.step."""
    from unittest import mock

    import docker

    from trainer.environments.swe.docker_backend import DockerBackend
    from trainer.environments.swe.sandbox import SandboxError

    client = mock.MagicMock()
    client.containers.list.return_value = []
    client.api.exec_create.side_effect = docker.errors.APIError("engine gone")
    backend = DockerBackend(client=client)
    backend.container = mock.MagicMock(id="c0")
    with pytest.raises(SandboxError, match="the Docker engine failed: APIError"):
        if call == "feed":
            backend._feed(["cat"], b"x", "placing the launcher")
        else:
            backend._stream_out(["cat", "report"], (tmp_path / "out").open("wb"), 1e12, "reading the report")
