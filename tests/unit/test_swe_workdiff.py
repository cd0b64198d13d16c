"""What grading does with the agent's repository (`workdiff.py`) and what it flags in it (`tamper.py`), on trees
built here: each expectation written out by hand."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from trainer.environments.swe.tamper import scan_changes, scan_plan
from trainer.environments.swe.workdiff import (
    TarTree,
    delta_tar,
    is_test_file,
    is_test_infrastructure,
    plan_grading,
    restore_in_place,
    restore_pytest_sections,
    tree_tar,
)

ORIGINAL = {
    "pkg/__init__.py": "from pkg.core import inc\n",
    "pkg/core.py": "def inc(x):\n    return x + 2\n",
    "conftest.py": "import pkg\n",
    "Tests/helper.py": "import pytest\n",
    "tests/test_core.py": "def test_inc(): pass\n",
    "setup.cfg": "[metadata]\nname = pkg\n\n[tool:pytest]\nmarkers =\n    slow: slow\n",
    "pyproject.toml": '[project]\nname = "pkg"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n',
    "docs/index.md": "# pkg\n",
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def tree(root: Path) -> TarTree:
    out = io.BytesIO()
    tree_tar(root, out)
    out.seek(0)
    return TarTree(out)


@pytest.fixture
def trees(tmp_path):
    original = write_tree(tmp_path / "original", ORIGINAL)
    agent = write_tree(tmp_path / "agent", ORIGINAL)
    return original, agent


def files_of(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "path, test_file",
    [
        ("tests/test_x.py", True),
        ("pkg/tests/helpers.py", True),  # a folder named tests on the path
        ("Tests/helper.py", True),
        ("test/data.json", True),
        ("pkg/test_util.py", True),
        ("pkg/util_test.py", True),
        ("pkg/testing/utils.py", False),  # numpy.testing is the package's own code
        ("pkg/_testing.py", False),
        ("pkg/contest.py", False),
        ("testing.py", False),
    ],
)
def test_test_files_by_r2e_gyms_rule(path, test_file):
    assert is_test_file(path) is test_file


def test_test_infrastructure_is_test_files_conftests_and_pytest_configuration():
    assert is_test_infrastructure("pkg/sub/conftest.py") and is_test_infrastructure("tox.ini")
    assert is_test_infrastructure(".pytest.ini") and is_test_infrastructure("sub/pyproject.toml")
    assert not is_test_infrastructure("pkg/core.py") and not is_test_infrastructure("README.md")


def test_pytest_sections_go_back_and_the_rest_stays(tmp_path):
    original = "[metadata]\nname = pkg\n\n[tool:pytest]\nmarkers =\n    slow: slow\n[flake8]\nmax = 1\n"
    agent = "[metadata]\nname = pkg2\n\n[tool:pytest]\naddopts = -p no:python\n[flake8]\nmax = 2\n"
    assert restore_pytest_sections("setup.cfg", original.encode(), agent.encode()).decode() == (
        "[metadata]\nname = pkg2\n\n[flake8]\nmax = 2\n[tool:pytest]\nmarkers =\n    slow: slow\n"
    )
    # a section the agent added where the original had none is dropped; pyproject's tables by prefix
    assert restore_pytest_sections("tox.ini", b"[tox]\n", b"[tox]\n[pytest]\naddopts = -x\n") == b"[tox]\n"
    toml = b'[project]\nname = "p"\n[tool.pytest.ini_options]\naddopts = "-x"\n[tool.black]\nline = 1\n'
    assert restore_pytest_sections("pyproject.toml", b'[project]\nname = "p"\n', toml) == (
        b'[project]\nname = "p"\n[tool.black]\nline = 1\n'
    )


def test_the_plan_keeps_the_fix_and_restores_the_test_infrastructure(trees):
    original, agent = trees
    (agent / "pkg/core.py").write_text("def inc(x):\n    return x + 1\n")  # the fix
    (agent / "pkg/new.py").write_text("X = 1\n")
    (agent / "docs/index.md").unlink()
    (agent / "conftest.py").write_text("import pkg\nimport pytest\n@pytest.hookimpl(hookwrapper=True)\n")
    (agent / "pkg/conftest.py").write_text("x = 1\n")  # added
    (agent / "tests/test_core.py").unlink()  # removed
    (agent / "tests/test_mine.py").write_text("def test_mine(): pass\n")  # an agent's own test
    (agent / "Tests/helper.py").write_text("import pytest\nX = 2\n")
    (agent / "setup.cfg").write_text("[metadata]\nname = pkg2\n\n[tool:pytest]\naddopts = -k nothing\n")
    (agent / "pyproject.toml").write_text('[project]\nname = "pkg"\n')  # the pytest table dropped
    plan = plan_grading(tree(original), tree(agent))
    assert plan.write == ["pkg/core.py", "pkg/new.py"]
    assert plan.delete == ["docs/index.md"]
    assert plan.restored == [
        "Tests/helper.py",
        "conftest.py",
        "pkg/conftest.py",
        "pyproject.toml",
        "setup.cfg",
        "tests/test_core.py",
        "tests/test_mine.py",
    ]
    assert plan.rewrite == {"setup.cfg": b"[metadata]\nname = pkg2\n\n[tool:pytest]\nmarkers =\n    slow: slow\n"}
    assert sorted(plan.added) == ["pkg/conftest.py", "pkg/new.py", "tests/test_mine.py"]
    assert set(plan.removed) == {"docs/index.md", "tests/test_core.py"}


def test_the_rows_own_fix_is_never_restored(trees):
    original, agent = trees
    (agent / "conftest.py").write_text("import pkg\nFIXTURE = 1\n")
    plan = plan_grading(tree(original), tree(agent), exempt=["conftest.py"])
    assert plan.write == ["conftest.py"] and plan.restored == []


def test_applying_the_delta_to_the_original_gives_the_graded_repository(trees, tmp_path):
    """As the Docker backend does it: the original's copy, the removals, then the delta's tar (GNU tar)."""
    original, agent = trees
    (agent / "pkg/core.py").write_text("def inc(x):\n    return x + 1\n")
    (agent / "pkg/sub/deep").mkdir(parents=True)
    (agent / "pkg/sub/deep/mod.py").write_text("Y = 1\n")
    (agent / "docs/index.md").unlink()
    (agent / "docs").rmdir()
    (agent / "conftest.py").write_text("import os\n")
    (agent / "tests/test_core.py").unlink()
    os.symlink("core.py", agent / "pkg/link.py")
    original_tree, agent_tree = tree(original), tree(agent)
    plan = plan_grading(original_tree, agent_tree)
    graded = tmp_path / "graded"
    subprocess.run(["cp", "-a", str(original), str(graded)], check=True)
    for path in plan.delete:  # the Docker backend's _DELETE, in Python
        target = graded / path
        if target.is_dir() and not target.is_symlink():
            try:
                target.rmdir()
            except OSError:
                pass
        else:
            target.unlink(missing_ok=True)
    delta = tmp_path / "delta.tar"
    with delta.open("wb") as out:
        delta_tar(plan, original_tree, agent_tree, out)
    subprocess.run(["tar", "-xf", str(delta), "-C", str(graded)], check=True)
    expected = files_of(agent)
    expected["conftest.py"] = ORIGINAL["conftest.py"]
    expected["tests/test_core.py"] = ORIGINAL["tests/test_core.py"]
    assert files_of(graded) == expected
    assert os.readlink(graded / "pkg/link.py") == "core.py" and not (graded / "docs").exists()


def test_restoring_in_place_does_the_same_on_the_agents_own_copy(trees):
    original, agent = trees
    (agent / "conftest.py").write_text("import os\n")
    (agent / "pkg/conftest.py").write_text("x = 1\n")
    (agent / "tests/test_core.py").unlink()
    (agent / "setup.cfg").write_text("[metadata]\nname = pkg2\n\n[tool:pytest]\naddopts = -k nothing\n")
    original_tree = tree(original)
    restore_in_place(plan_grading(original_tree, tree(agent)), original_tree, agent)
    expected = dict(ORIGINAL, **{"setup.cfg": "[metadata]\nname = pkg2\n\n[tool:pytest]\nmarkers =\n    slow: slow\n"})
    assert files_of(agent) == expected


def test_bytecode_and_the_graders_folders_are_not_the_agents_work(trees):
    original, agent = trees
    for name in (".venv/lib/x.py", ".git/HEAD", "r2e_tests/test_1.py", "pkg/__pycache__/core.cpython-311.pyc"):
        (agent / name).parent.mkdir(parents=True, exist_ok=True)
        (agent / name).write_text("x")
    (agent / "stray.pyc").write_bytes(b"\0")
    plan = plan_grading(tree(original), tree(agent))
    assert plan.changed == []


def test_a_sparse_file_is_left_out_without_being_read(tmp_path):
    """GNU tar's --sparse sends a sparse file's data only; the plan leaves it out rather than inflate it."""
    for name in ("original", "agent"):
        write_tree(tmp_path / name, {"pkg/core.py": "x = 1\n"})
    with open(tmp_path / "agent" / "holes.bin", "wb") as handle:
        handle.truncate(8 * 1024**3)  # 8 GiB of holes
    archives = {}
    for name in ("original", "agent"):
        archive = tmp_path / f"{name}.tar"
        subprocess.run(["tar", "--sparse", "-C", str(tmp_path / name), "-cf", str(archive), "."], check=True)
        assert archive.stat().st_size < 1024**2
        archives[name] = TarTree(archive)
    plan = plan_grading(archives["original"], archives["agent"])
    assert plan.write == [] and plan.dropped == [("holes.bin", f"a sparse file of {8 * 1024**3} bytes")]


def test_an_entry_in_the_way_of_restored_test_infrastructure_is_left_out(trees):
    original, agent = trees
    for path in sorted((agent / "tests").iterdir()):
        path.unlink()
    (agent / "tests").rmdir()
    (agent / "tests").write_text("not a folder\n")
    plan = plan_grading(tree(original), tree(agent))
    assert ("tests", "in the way of restored test infrastructure") in plan.dropped
    assert "tests" not in plan.write and "tests" not in plan.delete


# --------------------------------------------------------------------------------------------- static tamper scan

BEFORE = b"""import re
import signal


def parse(text):
    return re.compile("a+").match(text)


def on_alarm(signum, frame):
    signal.alarm(0)
"""

HONEST = [
    BEFORE + b"\n\ndef parse_all(texts):\n    return [parse(t) for t in texts]\n",
    BEFORE.replace(b'"a+"', b'"a*"'),
    BEFORE + b"\n\ndef later():\n    signal.setitimer(signal.ITIMER_REAL, 1)\n",  # signal: the file had it
    BEFORE + b"\n\nclass Point:\n    def __eq__(self, other):\n        return (self.x, self.y) == (other.x, other.y)\n",
    BEFORE + b"\n\ndef run(model, data):\n    model.eval()\n    return {'status': 'passed'}\n",
    BEFORE + b"\n\nimport json\n\ndef dump(x):\n    return json.dumps(x, sort_keys=True)\n",
]


@pytest.mark.parametrize("after", HONEST)
def test_an_honest_edit_is_not_flagged(after):
    assert scan_changes([("pkg/text.py", BEFORE, after)]) == []


@pytest.mark.parametrize(
    "added, kind",
    [
        (b"import gc\n", "process memory"),
        (b"open('/proc/self/mem', 'rb')\n", "process memory"),
        (b"import sys as _s\n_s.settrace(None)\n", "interpreter hooks"),
        (b"import sys\nsys.modules['_pytest.python'].Function.runtest = None\n", "monkeypatch"),
        (b"import json as j\nj.dumps = repr\n", "monkeypatch"),
        (b"import atexit\n", "exit hooks"),
        (b"from os import _exit\n_exit(0)\n", "exit hooks"),
        (b"import _pytest.reports\n", "test runner internals"),
        (b"def f():\n    raise RuntimeError('PASSED')\n", "runner output"),
        (b"class A:\n    def __eq__(self, other):\n        return True\n", "always-equal object"),
        (b"import os\nos.fork()\n", "processes"),
        (b"exec(compile('1', 'x', 'exec'))\n", "dynamic code"),
        (b"import builtins\n", "builtins"),
        (b"import hmac\n", "the grader's secrets"),
        (b"open('/testbed/r2e_tests/test_1.py')\n", "the grader's secrets"),
    ],
)
def test_what_a_forgery_needs_is_flagged_with_its_place(added, kind):
    flags = scan_changes([("pkg/text.py", BEFORE, BEFORE + added)])
    assert any(f.startswith(f"{kind}: pkg/text.py:") for f in flags), flags


def test_files_that_change_the_interpreter_or_the_runner_are_flagged_by_name():
    flags = scan_changes(
        [
            ("sitecustomize.py", None, b"x = 1\n"),
            ("extra.pth", None, b"import os\n"),
            ("pytest.py", None, b"x = 1\n"),
            ("pkg/_speedups.so", b"\x7fELF1", b"\x7fELF2"),
            ("pkg/pytest.py", None, b"x = 1\n"),  # not at the top: shadows nothing
        ]
    )
    assert [f.split(":")[0] for f in flags] == ["startup hook", "startup hook", "shadowed module", "native code"]


def test_python_2_code_is_read_word_by_word():
    assert scan_changes([("pkg/old.py", b"print 'x'\n", b"print 'x'\nimport gc\n")])[0].startswith("process memory")


def test_a_sparse_archive_is_what_gnu_tar_writes(tmp_path):
    """The sparse test's premise: GNU tar marks the member sparse, and tarfile sees it so."""
    with open(tmp_path / "holes.bin", "wb") as handle:
        handle.truncate(1024**2)
    subprocess.run(["tar", "--sparse", "-C", str(tmp_path), "-cf", str(tmp_path / "a.tar"), "holes.bin"], check=True)
    with tarfile.open(tmp_path / "a.tar") as tar:
        assert tar.getmember("holes.bin").issparse()


def test_an_added_script_nothing_imports_is_not_scanned_and_one_the_fix_imports_is(trees):
    """The agent's reproduction script may print "PASSED" and run subprocesses: it does not run during grading. The
    same code in a module the changed package imports does."""
    original, agent = trees
    script = "import subprocess\nprint('PASSED')\nsubprocess.run(['python', '-m', 'pytest'])\n"
    (agent / "reproduce_issue.py").write_text(script)
    plan = plan_grading(tree(original), tree(agent))
    assert scan_plan(plan, tree(original), tree(agent)) == []
    (agent / "helper.py").write_text("import gc\n")
    (agent / "pkg/core.py").write_text("import helper\n\ndef inc(x):\n    return x + 1\n")
    (agent / "cmd.py").write_text("import _pytest\n")  # shadows the standard library: loaded on its own
    flags = scan_plan(plan_grading(tree(original), tree(agent)), tree(original), tree(agent))
    assert [f.split(":")[:2] for f in flags] == [["test runner internals", " cmd.py"], ["process memory", " helper.py"]]
