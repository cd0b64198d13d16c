"""R2E-Gym's reward: run the hidden tests, parse each test's status, compare with the expected map.

Parsing and comparison are R2E-Gym's own rules (its `parse_log_pytest` and `_calculate_reward_r2e`), so a row of
R2E-Gym's data gets the reward R2E-Gym gives it:

* Only the lines after pytest's "short test summary info" marker count. A line containing "PASSED" is PASSED, else
  one containing "FAILED" is FAILED, else one containing "ERROR" is ERROR (substring tests, in that order); other
  lines (SKIPPED, XFAIL, XPASS) are dropped.
* A test's name is everything after the file in its node id, joined with dots, cut at " - " (the failure message):
  `r2e_tests/test_1.py::HTTPHeadersTest::test_copy` -> `HTTPHeadersTest.test_copy`, a module-level test keeps its
  bare name (`test_four`), parametrised ids stay (`TestStat.test_len[mean]`). A collection error
  (`ERROR r2e_tests/test_x.py - ImportError`) has no "::" and becomes the empty name.
* Reward 1 iff the parsed map has as many entries as the expected map and every non-empty parsed name is expected
  with the same status; else 0 (so a collection error costs the count, and same-named module-level tests of two
  files are one entry, both as in R2E-Gym). Keys of both maps lose colour codes and anything after " - ".

The one departure: the log loses every ANSI escape and carriage return before parsing (R2E-Gym removes colour
codes from keys only), so a terminal's control bytes never become part of a name.

`pytest_command` is the pytest invocation both backends run. It hardens grading a little against a policy that
edits /testbed to game it: it runs from inside the tests directory (so a /testbed/pytest.py cannot shadow
pytest), ignores every conftest.py and ini file of the repository (`--noconftest -c /dev/null`), loads no
third-party plugins, and puts /testbed on sys.path only through pytest's `pythonpath` option (after pytest has
been imported). Python runs isolated (`-I`: no user site-packages, no PYTHON* variables, no current directory
on the path) and PYTEST_ADDOPTS / PYTEST_PLUGINS are emptied, so nothing the agent left in its home or
environment loads into the test run (the Docker backend goes further and grades in a fresh container). It cannot
stop a patch that makes the package itself lie to the tests; nothing can.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

PARSED_STATUSES = ("PASSED", "FAILED", "ERROR")
"""What the parser reads, in the order it tests for them."""
STATUSES = (*PARSED_STATUSES, "SKIPPED", "XFAIL", "XPASS")
"""Statuses an expected map may name (pytest's outcomes); only PARSED_STATUSES can ever match."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MARKER = "short test summary info"

TEST_COMMAND = ("cd {testbed}/r2e_tests && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS= PYTEST_PLUGINS= "
                "{python} -I -B -m pytest -rA -p no:cacheprovider --noconftest -c /dev/null "
                "--rootdir={testbed} -o pythonpath={testbed} .")
"""The hidden tests' command; {testbed} and {python} must be shell-quoted by the caller."""


def pytest_command(python: str = "python3", testbed: str = "/testbed") -> str:
    """The test command for an interpreter and repository path (both already shell-safe)."""
    return TEST_COMMAND.format(python=python, testbed=testbed)


def report_key(line: str) -> str:
    """R2E-Gym's name of the test on a summary line: the node id's parts after the file, joined with dots, cut at
    " - "; colour codes removed. 'PASSED dir/test_x.py::C::test_y[p]' -> 'C.test_y[p]'."""
    return _ANSI.sub("", ".".join(line.split("::")[1:]).split(" - ")[0])


def parse_pytest_report(log: str) -> dict[str, str]:
    """{test name: status} from a `pytest -rA` log by R2E-Gym's rules; {} when the log has no short test summary."""
    log = _ANSI.sub("", log).replace("\r", "")
    if _MARKER not in log:
        return {}
    statuses: dict[str, str] = {}
    for line in log.split(_MARKER, 1)[1].strip().split("\n"):
        status = next((s for s in PARSED_STATUSES if s in line), None)
        if status is not None:
            statuses[report_key(line)] = status
    return statuses


def _normalised(statuses: dict[str, str]) -> dict[str, str]:
    """Keys without colour codes and cut at " - ", in sorted order (R2E-Gym's; on a clash the last key wins)."""
    return {_ANSI.sub("", key).split(" - ")[0]: statuses[key] for key in sorted(statuses)}


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
    for key, status in expected.items():
        if status not in STATUSES:
            raise ValueError(f"expected_output_json[{key!r}] = {status!r} is not one of {STATUSES}")
    return _normalised({str(key): status for key, status in expected.items()})


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
    """R2E-Gym's reward: 1.0 iff `parsed` has as many tests as `expected` and every non-empty parsed name is
    expected with the same status. The lists beside it say what differed."""
    parsed, expected = _normalised(parsed), _normalised(expected)
    missing = sorted(set(expected) - set(parsed))
    unexpected = sorted(set(parsed) - set(expected))
    mismatched = {k: (expected[k], parsed[k]) for k in sorted(set(expected) & set(parsed)) if expected[k] != parsed[k]}
    ok = len(parsed) == len(expected) and all(expected.get(k) == v for k, v in parsed.items() if k)
    return Grade(1.0 if ok else 0.0, parsed, missing, unexpected, mismatched)
