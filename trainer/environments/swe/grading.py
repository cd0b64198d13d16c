"""R2E-Gym's reward: run the hidden tests, parse each test's status, compare with the expected map.

The reward is 1.0 iff the parsed map has exactly the expected tests (same number, same keys) and every status
matches; else 0.0. The expected map encodes the gold patch's outcome, so fail-to-pass tests must pass and
pass-to-pass tests must keep passing; a crashed, timed-out or empty test run parses to a map that cannot match.

Keys follow R2E-Gym's pytest log parser: the test file's base name, "::", and the last part of the node id,
e.g. "test_roman.py::test_four" or "test_wrap.py::test_case[3-x]"; ANSI colour codes are removed and a key is
cut at " - " (pytest appends the failure message there). Statuses come from the `-rA` "short test summary info"
section: PASSED, FAILED, ERROR, XFAIL, XPASS (R2E-Gym reads the first three; the x-statuses name a test, so
they are kept rather than dropped). SKIPPED lines carry no test id in that section and are ignored; a
collection error ("ERROR r2e_tests/test_x.py") becomes the key "test_x.py" with status ERROR, which can never
match an expected map and so gives 0.

`pytest_command` is the pytest invocation both backends run. It hardens grading a little against a policy that
edits /testbed to game it: it runs from inside the tests directory (so a /testbed/pytest.py cannot shadow
pytest), ignores every conftest.py and ini file of the repository (`--noconftest -c /dev/null`), loads no
third-party plugins, and puts /testbed on sys.path only through pytest's `pythonpath` option (after pytest has
been imported). Python runs isolated (`-I`: no user site-packages, no PYTHON* variables, no current directory
on the path) and PYTEST_ADDOPTS / PYTEST_PLUGINS are emptied, so nothing the agent left in its home or
environment loads into the test run (the Docker backend goes further and grades in a fresh container). It cannot stop a patch that makes the package itself lie to the tests; nothing can.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

STATUSES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S.*)$")

TEST_COMMAND = ("cd {testbed}/r2e_tests && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS= PYTEST_PLUGINS= "
                "{python} -I -B -m pytest -rA -p no:cacheprovider --noconftest -c /dev/null "
                "--rootdir={testbed} -o pythonpath={testbed} .")
"""The hidden tests' command; {testbed} and {python} must be shell-quoted by the caller."""


def pytest_command(python: str = "python3", testbed: str = "/testbed") -> str:
    """The test command for an interpreter and repository path (both already shell-safe)."""
    return TEST_COMMAND.format(python=python, testbed=testbed)


def report_key(node: str) -> str:
    """R2E-Gym's key for a summary-line node id: 'dir/test_x.py::Class::test_y[p] - msg' -> 'test_x.py::test_y[p]'."""
    node = _ANSI.sub("", node).strip()
    parts = node.split("::")
    key = parts[0].split("/")[-1] if len(parts) == 1 else parts[0].split("/")[-1] + "::" + parts[-1]
    return key.split(" - ")[0].strip()


def parse_pytest_report(log: str) -> dict[str, str]:
    """{test key: status} from a `pytest -rA` log; {} when the log has no short test summary."""
    log = _ANSI.sub("", log).replace("\r", "")
    marker = "short test summary info"
    if marker not in log:
        return {}
    statuses: dict[str, str] = {}
    for line in log.split(marker, 1)[1].splitlines():
        match = _SUMMARY_LINE.match(line.strip())
        if match:
            statuses[report_key(match.group(2))] = match.group(1)
    return statuses


def parse_expected(expected_output_json: str | dict) -> dict[str, str]:
    """The task's expected map, with keys normalised like parsed ones; bad input raises ValueError."""
    if isinstance(expected_output_json, str):
        try:
            expected = json.loads(expected_output_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected_output_json is not valid JSON: {exc}") from None
    else:
        expected = expected_output_json
    if not isinstance(expected, dict) or not expected:
        raise ValueError(f"expected_output_json must be a non-empty JSON object, got {expected!r:.80}")
    out = {}
    for key, status in expected.items():
        if status not in STATUSES:
            raise ValueError(f"expected_output_json[{key!r}] = {status!r} is not one of {STATUSES}")
        out[report_key(str(key))] = status
    return out


@dataclass
class Grade:
    """The outcome of grading one final repository state."""

    reward: float
    parsed: dict[str, str]
    missing: list[str] = field(default_factory=list)
    """Expected tests absent from the log."""
    unexpected: list[str] = field(default_factory=list)
    """Tests in the log that the expected map does not list."""
    mismatched: dict[str, tuple[str, str]] = field(default_factory=dict)
    """test -> (expected status, parsed status)."""


def grade(parsed: dict[str, str], expected: dict[str, str]) -> Grade:
    """Reward 1.0 iff `parsed` has exactly the expected tests and every status matches."""
    missing = sorted(set(expected) - set(parsed))
    unexpected = sorted(set(parsed) - set(expected))
    mismatched = {k: (expected[k], parsed[k]) for k in sorted(set(expected) & set(parsed)) if expected[k] != parsed[k]}
    ok = not missing and not unexpected and not mismatched and len(parsed) == len(expected)
    return Grade(1.0 if ok else 0.0, parsed, missing, unexpected, mismatched)
