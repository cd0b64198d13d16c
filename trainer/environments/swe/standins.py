"""R2E-Gym stand-ins: images laid out as R2E-Gym's are, and their rows, built here (no registry is needed or used).

    python -m trainer.environments.swe.standins [--out rows.jsonl] [--layouts NAME ...]

R2E-Gym's images are built `FROM ubuntu:22.04` with uv under /root: the repository's environment is `uv venv
--python 3.x`, so `/testbed/.venv/bin/python` points at an interpreter under `/root/.local/share/uv/python`, and
its tests run with `/testbed/run_tests.sh` (`.venv/bin/python -W ignore -m pytest -rA r2e_tests`) with the
repository's conftest honoured; several repositories' root conftest imports the package or registers a plugin of
the repository (Pillow's is `pytest_plugins = ["Tests.helper"]`). A stand-in has all of that, with a small
repository of its own in place of Pillow's:

* the interpreter: one of this machine's pyenv builds (3.7-3.11), trimmed of its tests, docs and static library,
  copied to `/root/.local/share/uv/python/cpython-X.Y.Z-linux-x86_64-gnu` (with a link at its build prefix, where
  its shared library is looked up);
* `/testbed/.venv` made by that interpreter's `venv`, with the layout's pytest (4.6 to 8.3) and its dependencies,
  installed on the host by that interpreter's own pip (which honours each release's Requires-Python);
* `/testbed`: the package `numerals` with a bug, a root `conftest.py` that imports it and/or registers the plugin
  `Tests.helper` (whose fixture the hidden tests use), the layout's pytest configuration file, a visible test file;
  and, for the large layout, build artefacts and a bulky installed package (about 90 MB together);
* `/r2e_tests/test_1.py` and `test_2.py` (the hidden tests: what the fix keeps passing, what it makes pass; classes
  and parametrised ids), `/testbed/run_tests.sh`; no unprivileged
  user (R2E-Gym runs the agent as root). The unittest layout runs its tests with a runner script of its own, as
  R2E-Gym's tornado rows do, whose log has pytest's short summary.

Each image's row is R2E-Gym-shaped: `docker_image`, `repo_name`, `problem_statement`, `expected_output_json`
(R2E-Gym's names: `TestToRoman.test_four`, `test_samples[4-IV]`) and `parsed_commit_content` (R2E-Gym's
`ParsedCommit`: the fix in numerals/core.py and the visible test file the commit changed), so the preflight can
rebuild the gold fix from it. Tags are content hashes: an unchanged layout is never rebuilt.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainer.environments.swe.image import build_base_image

REPOSITORY = "swe-harness-standin"
PYENV_ROOT = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
UV_PYTHON = "/root/.local/share/uv/python"
TRIMMED = {"test", "tests", "idlelib", "tkinter", "turtledemo", "site-packages", "ensurepip", "__pycache__", "include"}
"""Folders of an interpreter not copied into an image (R2E-Gym's uv interpreters are python-build-standalone's
install_only builds, which also lack most of them)."""
R2E_RUN_TESTS = ".venv/bin/python -W ignore -m pytest -rA r2e_tests\n"
RUNNER_RUN_TESTS = ".venv/bin/python -W ignore r2e_tests/runner.py\n"
BULK_BYTES = 64 * 1024**2
BULK_MODULES = 3000


@dataclass(frozen=True)
class Layout:
    """One stand-in image's shape."""

    name: str
    python: str
    """A pyenv version (`pyenv versions`)."""
    pytest: str
    conftest: str
    """"imports" (the root conftest imports the package), "plugin" (it registers Tests.helper) or "both"."""
    config: str
    """Where the pytest configuration is: "setup.cfg", "tox.ini", "pytest.ini" or "pyproject.toml"."""
    runner: str = "pytest"
    """"pytest" (R2E-Gym's run_tests.sh) or "unittest" (a runner script of the hidden tests', no `-m pytest`)."""
    bulk: bool = False
    """Build artefacts and a bulky package, for a /testbed of realistic size."""

    @property
    def minor(self) -> str:
        return ".".join(self.python.split(".")[:2])


LAYOUTS = (
    Layout("py37-pytest46", "3.7.16", "4.6.11", "imports", "setup.cfg"),
    Layout("py38-pytest54", "3.8.18", "5.4.3", "plugin", "tox.ini"),
    Layout("py39-pytest62", "3.9.18", "6.2.5", "both", "pytest.ini"),
    Layout("py311-pytest74", "3.11.7", "7.4.4", "both", "pyproject.toml"),
    Layout("py311-pytest83-large", "3.11.7", "8.3.5", "both", "setup.cfg", bulk=True),
    Layout("py311-unittest", "3.11.7", "8.3.5", "imports", "setup.cfg", runner="unittest"),
)

BUGGY = '''"""Roman numerals."""

_NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (1, "I"),
]


def to_roman(number):
    """The Roman numeral of an integer in 1..3999."""
    if not 1 <= number <= 3999:
        raise ValueError("%d is outside 1..3999" % number)
    parts = []
    for value, numeral in _NUMERALS:
        while number >= value:
            parts.append(numeral)
            number -= value
    return "".join(parts)


def from_roman(text):
    """The integer a standard Roman numeral stands for."""
    for number in range(1, 4000):
        if to_roman(number) == text:
            return number
    raise ValueError("not a standard numeral: %r" % text)
'''
FIXED = BUGGY.replace('(10, "X"), (9, "IX"), (5, "V"), (1, "I")', '(10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")')
ISSUE = """[ISSUE]
Title: to_roman(4) returns IIII

`to_roman(4)` gives `'IIII'` and `to_roman(14)` gives `'XIIII'`; the standard numerals are `IV` and `XIV`.
`from_roman('IV')` raises `ValueError: not a standard numeral: 'IV'`.
[/ISSUE]"""

HELPER = '''"""The repository's pytest plugin (registered by the root conftest, as Pillow's Tests.helper is)."""
import pytest

SAMPLES = [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (1994, "MCMXCIV")]


@pytest.fixture
def samples():
    return list(SAMPLES)


def pytest_configure(config):
    config.addinivalue_line("markers", "numerals: tests of the numerals package")
'''

VISIBLE_TEST = """from numerals import to_roman


def test_one():
    assert to_roman(1) == "I"
"""


def conftest_text(kind: str) -> str:
    parts = ['"""Root conftest of the repository (honoured by its test command, as R2E-Gym runs it)."""\n']
    if kind in ("imports", "both"):
        parts.append(
            "import numerals\n\n\ndef pytest_report_header(config):\n    return 'numerals ' + numerals.VERSION\n"
        )
    if kind in ("plugin", "both"):
        parts.append('\npytest_plugins = ["Tests.helper"]\n')
    return "\n".join(parts)


def config_files(layout: Layout) -> dict[str, str]:
    markers = "markers =\n    slow: slow tests\n"
    if layout.config == "pyproject.toml":
        body = '[tool.pytest.ini_options]\nmarkers = ["slow: slow tests"]\n'
        return {"pyproject.toml": '[project]\nname = "numerals"\nversion = "1.0"\n\n' + body}
    header = {"setup.cfg": "[tool:pytest]", "tox.ini": "[pytest]", "pytest.ini": "[pytest]"}[layout.config]
    text = f"{header}\n{markers}"
    if layout.config == "setup.cfg":
        text = "[metadata]\nname = numerals\nversion = 1.0\n\n" + text
    if layout.config == "tox.ini":
        text = "[tox]\nenvlist = py\n\n" + text
    return {layout.config: text}


def hidden_tests(layout: Layout) -> tuple[dict[str, str], dict[str, str]]:
    """({file name: text} of /r2e_tests, the expected map by R2E-Gym's names) of a layout: the tests the fix keeps
    passing in test_1.py, those it makes pass in test_2.py (R2E-Gym's rows often have several files)."""
    if layout.runner == "unittest":
        text = """import unittest

from numerals import from_roman, to_roman


class TestToRoman(unittest.TestCase):
    def test_small(self):
        self.assertEqual(to_roman(3), "III")

    def test_four(self):
        self.assertEqual(to_roman(4), "IV")


class TestFromRoman(unittest.TestCase):
    def test_parse_four(self):
        self.assertEqual(from_roman("IV"), 4)

    def test_round_trip(self):
        self.assertTrue(all(from_roman(to_roman(n)) == n for n in range(1, 50)))
"""
        expected = {
            "TestToRoman.test_small": "PASSED",
            "TestToRoman.test_four": "PASSED",
            "TestFromRoman.test_parse_four": "PASSED",
            "TestFromRoman.test_round_trip": "PASSED",
        }
        return {"test_1.py": text, "runner.py": RUNNER}, expected
    first = """from numerals import from_roman, to_roman


def test_small():
    assert to_roman(3) == "III"


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 50))
"""
    second = """import pytest

from numerals import from_roman, to_roman


class TestToRoman:
    def test_four(self):
        assert to_roman(4) == "IV"

    @pytest.mark.parametrize("number, numeral", [(14, "XIV"), (1994, "MCMXCIV")])
    def test_larger(self, number, numeral):
        assert to_roman(number) == numeral


def test_parse_four():
    assert from_roman("IV") == 4
"""
    expected = {
        "test_small": "PASSED",
        "test_round_trip": "PASSED",
        "TestToRoman.test_four": "PASSED",
        "TestToRoman.test_larger[14-XIV]": "PASSED",
        "TestToRoman.test_larger[1994-MCMXCIV]": "PASSED",
        "test_parse_four": "PASSED",
    }
    if layout.conftest in ("plugin", "both"):
        first += """

def test_samples(samples):
    assert [to_roman(n) for n, _ in samples if n != 4 and n != 14 and n != 1994] == ["I", "IX"]
"""
        expected["test_samples"] = "PASSED"
    return {"test_1.py": first, "test_2.py": second}, expected


RUNNER = '''"""Runs the hidden tests with unittest and prints pytest's short summary (as R2E-Gym's tornado runner does)."""
import os
import sys
import unittest

sys.path.insert(0, os.getcwd())
HERE = os.path.dirname(os.path.abspath(__file__))


class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = []

    def addSuccess(self, test):
        self.outcomes.append(("PASSED", test))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes.append(("FAILED", test))

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes.append(("ERROR", test))


suite = unittest.defaultTestLoader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
result = Result()
suite.run(result)
for test, trace in result.failures + result.errors:
    print(trace)
print("==================== short test summary info ====================")
for outcome, test in result.outcomes:
    module, cls, name = test.id().split(".")
    print("%s r2e_tests/%s.py::%s::%s" % (outcome, module, cls, name))
sys.exit(0 if result.wasSuccessful() else 1)
'''


def parsed_commit(layout: Layout) -> dict:
    """R2E-Gym's `ParsedCommit` of the layout's fix: numerals/core.py (the fix) and the visible test file."""

    def diff(path: str, old: str, new: str) -> dict:
        return {
            "header": {"file": {"path": path}, "misc_line": None},
            "index_line": None,
            "is_binary_file": False,
            "binary_line": None,
            "minus_file": {"path": f"a/{path}"},
            "plus_file": {"path": f"b/{path}"},
            "old_file_content": old,
            "new_file_content": new,
            "hunks": [],
        }

    tests = VISIBLE_TEST + '\n\ndef test_four():\n    assert to_roman(4) == "IV"\n'
    return {
        "old_commit_hash": "0" * 40,
        "new_commit_hash": hashlib.sha1(layout.name.encode()).hexdigest(),
        "commit_message": "Write 4 as IV",
        "commit_date": "2026-12-01T00:00:00",
        "metadata": {},
        "file_diffs": [
            diff("numerals/core.py", BUGGY, FIXED),
            diff("Tests/test_core.py", VISIBLE_TEST, tests),
        ],
    }


def site_packages(layout: Layout) -> Path:
    """pytest and its dependencies for the layout's interpreter, installed once by that interpreter's own pip into
    a cache folder (`XDG_CACHE_HOME`/swe-harness)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swe-harness" / "site-packages"
    target = cache / f"{layout.minor}-pytest-{layout.pytest}"
    if (target / ".complete").exists():
        return target
    python = interpreter(layout)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + "-", dir=cache))
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-compile",
            "--target",
            str(staging),
            f"pytest=={layout.pytest}",
        ],
        check=True,
    )
    (staging / ".complete").write_text("")
    try:
        os.replace(staging, target)
    except OSError:  # another process got there first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def interpreter(layout: Layout) -> Path:
    python = PYENV_ROOT / "versions" / layout.python / "bin" / f"python{layout.minor}"
    if not python.exists():
        raise FileNotFoundError(
            f"stand-in layout {layout.name!r} needs the pyenv interpreter {layout.python} ({python} is missing; "
            f"`pyenv install {layout.python}`)"
        )
    return python


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, mode: int = 0o644, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, 0
    if link:
        info.type, info.linkname = tarfile.SYMTYPE, link
        tar.addfile(info)
    elif data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _add_tree(tar: tarfile.TarFile, source: Path, into: str, skip: set[str] = frozenset()) -> None:
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if skip & set(relative.parts) or path.suffix in (".pyc", ".a"):
            continue
        tar.add(path, arcname=f"{into}/{relative.as_posix()}", recursive=False)


def payload(layout: Layout) -> bytes:
    """The tar the image's single ADD unpacks at /."""
    prefix = PYENV_ROOT / "versions" / layout.python
    uv_dir = f"{UV_PYTHON}/cpython-{layout.python}-linux-x86_64-gnu"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_tree(tar, prefix, uv_dir.lstrip("/"), skip=TRIMMED | {f"config-{layout.minor}-x86_64-linux-gnu"})
        _add(tar, str(prefix).lstrip("/"), link=uv_dir)
        _add_tree(tar, site_packages(layout), "opt/standin-site")
        files = {
            "numerals/__init__.py": 'from numerals.core import from_roman, to_roman\n\nVERSION = "1.0"\n',
            "numerals/core.py": BUGGY,
            "conftest.py": conftest_text(layout.conftest),
            "Tests/__init__.py": "",
            "Tests/helper.py": HELPER,
            "Tests/test_core.py": VISIBLE_TEST,
            "README.md": "# numerals\n",
            **config_files(layout),
        }
        for name, text in sorted(files.items()):
            _add(tar, f"testbed/{name}", text.encode())
        run_tests = RUNNER_RUN_TESTS if layout.runner == "unittest" else R2E_RUN_TESTS
        _add(tar, "testbed/run_tests.sh", run_tests.encode(), 0o755)
        tests, _ = hidden_tests(layout)
        _add(tar, "r2e_tests", None)
        for name, text in sorted(tests.items()):
            _add(tar, f"r2e_tests/{name}", text.encode())
    return buffer.getvalue()


def dockerfile(layout: Layout, base: str) -> str:
    python = f"{UV_PYTHON}/cpython-{layout.python}-linux-x86_64-gnu/bin/python{layout.minor}"
    site = f"/testbed/.venv/lib/python{layout.minor}/site-packages"
    steps = [
        "userdel -r agent",
        f"{python} -m venv --without-pip /testbed/.venv",
        f"cp -a /opt/standin-site/. {site}/",
        "rm -rf /opt/standin-site",
        "mv " + site + "/bin/* /testbed/.venv/bin/ 2>/dev/null || true",
        "sed -i '1s|.*|#!/testbed/.venv/bin/python|' /testbed/.venv/bin/py*test",
    ]
    if layout.bulk:
        steps += [
            "mkdir -p /testbed/build/lib",
            f"head -c {BULK_BYTES} /dev/urandom > /testbed/build/lib/_numerals_native.so",
            f"mkdir -p {site}/bulkpkg && for i in $(seq 1 {BULK_MODULES}); do "
            f"head -c 6000 /dev/urandom | base64 | sed 's/^/# /' > {site}/bulkpkg/mod_$i.py; done",
        ]
    return (
        f"FROM {base}\nADD files.tar /\nRUN set -e; " + "; ".join(steps) + "\nWORKDIR /testbed\n"
        f"LABEL harness.swe.standin={json.dumps(layout.name)}\n"
    )


def build(client, layout: Layout, base: str) -> str:
    """Build (or find) the layout's image; returns its content-hash tag."""
    data = payload(layout)
    recipe = dockerfile(layout, base)
    tag = f"{REPOSITORY}/{layout.name}:{hashlib.sha256(recipe.encode() + data).hexdigest()[:12]}"
    try:
        client.images.get(tag)
        return tag
    except Exception:
        pass
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        _add(tar, "Dockerfile", recipe.encode())
        _add(tar, "files.tar", data)
    context.seek(0)
    client.images.build(
        fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, network_mode="none", pull=False
    )
    return tag


def row(layout: Layout, image: str) -> dict:
    """The layout's R2E-Gym-shaped task row."""
    _, expected = hidden_tests(layout)
    return {
        "task_id": f"standin__{layout.name}",
        "repo_name": "numerals",
        "docker_image": image,
        "commit_hash": parsed_commit(layout)["new_commit_hash"],
        "problem_statement": ISSUE,
        "expected_output_json": json.dumps(expected),
        "parsed_commit_content": json.dumps(parsed_commit(layout)),
        "modified_files": ["numerals/core.py", "Tests/test_core.py"],
        "split": "train",
    }


def build_standins(client=None, layouts=LAYOUTS) -> list[dict]:
    """Build every layout's image (the base image first) and return their rows."""
    from trainer.environments.swe.containers import docker_client

    client = client or docker_client(timeout=900)
    base = build_base_image(client)
    return [row(layout, build(client, layout, base)) for layout in layouts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.environments.swe.standins", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", default=None, help="write the rows here (JSONL); default: standard output")
    parser.add_argument(
        "--layouts",
        nargs="*",
        default=None,
        help=f"layouts to build (default all: {[layout.name for layout in LAYOUTS]})",
    )
    args = parser.parse_args(argv)
    chosen = [layout for layout in LAYOUTS if args.layouts is None or layout.name in args.layouts]
    unknown = set(args.layouts or ()) - {layout.name for layout in LAYOUTS}
    if unknown:
        parser.error(f"unknown layouts: {sorted(unknown)}")
    rows = build_standins(layouts=chosen)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
