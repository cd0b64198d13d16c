"""R2E-Gym's rewards: run the hidden tests, parse each test's status, compare with what the row expects.

Two kinds of rows, graded as R2E-Gym grades each (`tasks.ROW_KINDS`):
* R2E-Gym rows (`expected_output_json`): R2E-Gym's own parser and all-equal rule, below.
* SWE-bench rows (`FAIL_TO_PASS` / `PASS_TO_PASS`, `repo`, `version`; SWE-bench Verified as R2E-Gym loads it):
  `grade_swebench`, through the swebench package at the version R2E-Gym pins (`SWEBENCH_REQUIREMENT`), as
  R2E-Gym's `_calculate_reward_swebench` does: a log holding one of swebench's failure markers parses to nothing;
  otherwise the part after the last echo of the repository's test command goes to the repository's log parser;
  the reward is 1 when swebench's report says FULL (every FAIL_TO_PASS and PASS_TO_PASS test passed or xfailed;
  a skipped one counts neither way; a missing one fails).

R2E-Gym rows:

Parsing and comparison are R2E-Gym's own rules (its `parse_log_pytest` and `_calculate_reward_r2e`), so a row of
R2E-Gym's data gets the reward R2E-Gym gives it:

* Only the lines after pytest's "short test summary info" marker count. A line containing "PASSED" is PASSED, else
  one containing "FAILED" is FAILED, else one containing "ERROR" is ERROR (substring tests, in that order); other
  lines (SKIPPED, XFAIL, XPASS) are dropped.
* A test's name is everything after the file in its node id, joined with dots, cut at " - " (the failure message):
  `r2e_tests/test_1.py::HTTPHeadersTest::test_copy` -> `HTTPHeadersTest.test_copy`, a module-level test keeps its
  bare name (`test_four`), parametrised ids stay (`TestStat.test_len[mean]`). A collection error
  (`ERROR r2e_tests/test_x.py - ImportError`) has no "::" and becomes the empty name.
* Reward 1 iff the parsed map has as many entries as the expected map and every parsed name, the empty one
  included, is expected with the same status; else 0 (same-named module-level tests of two files are one entry,
  as in R2E-Gym). Keys of both maps lose colour codes and anything after " - ".

Two departures: the log loses every ANSI escape and carriage return before parsing (R2E-Gym removes colour codes
from keys only), so a terminal's control bytes never become part of a name; and the empty name is compared like
any other. R2E-Gym (69bc953) looks it up in the expected map and raises KeyError when it is not there, so a
collection error ends its grading; a rule that skipped it instead would pay a repository that breaks the import of
a failing test's file (the collection error stands in for the test in the count).

`pytest_command` is the pytest invocation both backends run. It hardens grading a little against a policy that
edits /testbed to game it: it runs from inside the tests directory (so a /testbed/pytest.py cannot shadow
pytest), ignores every conftest.py and ini file of the repository (`--noconftest -c /dev/null`), loads no
third-party plugins, and puts /testbed on sys.path only through pytest's `pythonpath` option (after pytest has
been imported). Python runs isolated (`-I`: no user site-packages, no PYTHON* variables, no current directory
on the path) and PYTEST_ADDOPTS / PYTEST_PLUGINS are emptied, so nothing the agent left in its home or
environment loads into the test run (the Docker backend goes further and grades in a fresh container). What runs
inside the test process is the launcher's business (report_launcher.py says what it stops and what it cannot).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

PARSED_STATUSES = ("PASSED", "FAILED", "ERROR")
"""What the parser reads, in the order it tests for them."""
STATUSES = (*PARSED_STATUSES, "SKIPPED", "XFAIL", "XPASS")
"""Statuses an expected map may name (pytest's outcomes); only PARSED_STATUSES can ever match."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MARKER = "short test summary info"

TEST_COMMAND = (
    "cd {testbed}/r2e_tests && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS= PYTEST_PLUGINS= "
    "{python} -I -B {pytest} -rA -p no:cacheprovider --noconftest -c /dev/null "
    "--rootdir={testbed} -o pythonpath={testbed} ."
)
"""The hidden tests' command; {testbed}, {python} and {pytest} must be shell-quoted by the caller."""

GRADINGS = ("report", "r2e_gym_log")
"""How an R2E-Gym row's statuses are read: from the launcher's signed report (`read_report`, the default) or from
the log's text by R2E-Gym's rule (`parse_pytest_report`, forgeable by the tested code)."""

LAUNCHER_PATH = Path(__file__).with_name("report_launcher.py")
"""The launcher the hardened reading runs pytest through (standalone: it runs under the task's interpreter)."""


def pytest_command(python: str = "python3", testbed: str = "/testbed", launcher: str | None = None) -> str:
    """The test command for an interpreter and repository path (both already shell-safe). `launcher`: the shell-safe
    words "LAUNCHER KEY_FILE REPORT_FILE", to run pytest through `report_launcher.py`; None: `python -m pytest`."""
    return TEST_COMMAND.format(python=python, testbed=testbed, pytest=launcher or "-m pytest")


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


SUMMARY_ORDER = ("passed", "skipped", "xfailed", "xpassed", "error", "failed")
"""The order of pytest's `-rA` short summary by category (terminal.py: reportchars "PpsxXEf"); R2E-Gym's map keeps
the last line of a test, so a test whose call passed and whose teardown errored is ERROR."""
CATEGORY_STATUS = {"passed": "PASSED", "error": "ERROR", "failed": "FAILED"}
"""The categories whose summary lines R2E-Gym's parser reads, and the status each gives."""


@dataclass(frozen=True)
class ReportReading:
    """The statuses the launcher's report gives, or why it cannot be trusted (then `statuses` is empty), and what
    the launcher saw change in the test runner (`report_launcher.py`; judged by `tamper.dynamic_flags`)."""

    statuses: dict[str, str]
    problem: str | None = None
    observations: list[dict] = field(default_factory=list)


def read_report(report: bytes | None, key: bytes, exit_code: int) -> ReportReading:
    """{test name: status} from `report_launcher.py`'s signed report, in R2E-Gym's key and status terms, as R2E-Gym's
    parser reads an honest `-rA` log (the test's last summary line by `SUMMARY_ORDER`; skipped, xfail and xpass
    dropped; a collection error is the empty name), and the launcher's observations.

    The reading is refused (empty statuses and the reason) when a line is not signed with `key`, records are
    missing or out of order, the start or the session's end is missing, or a collected test was never run. Once
    the signed end exists, what the process does after it (a crash at interpreter shutdown, another exit code)
    changes nothing: `exit_code` is only named when the end is missing."""
    if not report:
        return ReportReading({}, "no report: the tests did not start, or the launcher could not write")
    records = []
    for number, line in enumerate(report.decode(errors="replace").splitlines(), 1):
        try:  # the tested code can write to the file: any line may be hostile (deep nesting: RecursionError)
            signed = json.loads(line)
            body, mac = signed["record"], signed["mac"]
            good = hmac.compare_digest(hmac.new(key, body.encode(), hashlib.sha256).hexdigest(), mac)
            record = json.loads(body) if good else None
        except Exception:
            record = None
        if not isinstance(record, dict):
            return ReportReading({}, f"line {number} of the report is not the launcher's (no valid signature)")
        records.append(record)
    observations = [r for r in records if r.get("kind") == "observed"]
    if [r.get("seq") for r in records] != list(range(len(records))):
        return ReportReading({}, "the report's records are missing or out of order", observations)
    if not records or records[0].get("kind") != "start":
        return ReportReading({}, "the report does not begin with the launcher's start", observations)
    finish = records[-1]
    if finish.get("kind") != "finish":
        return ReportReading({}, f"the process ended (exit code {exit_code}) before pytest's session did", observations)
    reports = [r for r in records if r.get("kind") == "report"]
    collected = [n for r in records if r.get("kind") == "collected" for n in r.get("nodeids", [])]
    if finish.get("exitstatus") in (0, 1):
        unrun = sorted(set(collected) - {r.get("nodeid") for r in reports if r.get("when") == "teardown"})
        if unrun:
            return ReportReading({}, f"{len(unrun)} collected tests never ran (first: {unrun[0]})", observations)
    statuses: dict[str, str] = {}
    for category in SUMMARY_ORDER:
        for r in reports:
            if r.get("category") == category and category in CATEGORY_STATUS:
                statuses[report_key(str(r.get("nodeid")))] = CATEGORY_STATUS[category]
    return ReportReading(statuses, None, observations)


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
    """R2E-Gym's reward: 1.0 iff `parsed` has as many tests as `expected` and every parsed name (the empty one of a
    collection error included) is expected with the same status. The lists beside it say what differed."""
    parsed, expected = _normalised(parsed), _normalised(expected)
    missing = sorted(set(expected) - set(parsed))
    unexpected = sorted(set(parsed) - set(expected))
    mismatched = {k: (expected[k], parsed[k]) for k in sorted(set(expected) & set(parsed)) if expected[k] != parsed[k]}
    ok = len(parsed) == len(expected) and all(k in expected and expected[k] == v for k, v in parsed.items())
    return Grade(1.0 if ok else 0.0, parsed, missing, unexpected, mismatched)


# --------------------------------------------------------------------------------------------- SWE-bench rows

SWEBENCH_REQUIREMENT = "swebench==3.0.2"
"""The swebench release R2E-Gym pins (its pyproject); its log parsers, test commands and report rules grade
SWE-bench rows. Installed by the project's `test` and `swebench` extras."""


def _swebench():
    """swebench's harness modules, imported on first use (they take a few seconds and pull many packages)."""
    try:
        from swebench.harness import constants, grading, log_parsers
    except ImportError as exc:
        raise ImportError(
            f"SWE-bench rows are graded with swebench's own log parsers, as R2E-Gym grades them: "
            f"pip install '{SWEBENCH_REQUIREMENT}' (the project's `swebench` extra); "
            f"importing it failed: {exc}"
        ) from None
    return constants, grading, log_parsers


def swebench_test_command(repo: str, version: str) -> str:
    """The test command swebench runs for `repo` at `version` (R2E-Gym cuts the log at its last echo); ValueError
    naming the field when swebench does not know the repository or the version."""
    constants, _, log_parsers = _swebench()
    if repo not in log_parsers.MAP_REPO_TO_PARSER or repo not in constants.MAP_REPO_VERSION_TO_SPECS:
        raise ValueError(
            f"field 'repo' is {repo!r}, which swebench has no log parser for (known: "
            f"{', '.join(sorted(log_parsers.MAP_REPO_TO_PARSER))})"
        )
    specs = constants.MAP_REPO_VERSION_TO_SPECS[repo]
    if version not in specs:
        raise ValueError(
            f"field 'version' is {version!r}, not a version swebench knows for {repo} "
            f"(known: {', '.join(sorted(specs))})"
        )
    command = specs[version]["test_cmd"]
    return command[-1] if isinstance(command, list) else command


def parse_swebench_log(log: str, repo: str, version: str) -> dict[str, str]:
    """{test: status} from the output of a SWE-bench image's /run_tests.sh (stdout and stderr interleaved), as
    R2E-Gym's `get_logs_eval` reads it: {} when a failure marker (patch not applied, tests errored or timed out)
    is in the log, else the repository's swebench parser on the part after the last echo of the test command."""
    constants, _, log_parsers = _swebench()
    command = swebench_test_command(repo, version)
    markers = (constants.APPLY_PATCH_FAIL, constants.RESET_FAILED, constants.TESTS_ERROR, constants.TESTS_TIMEOUT)
    if any(marker in log for marker in markers):
        return {}
    return log_parsers.MAP_REPO_TO_PARSER[repo](log.split(command)[-1], None)


def grade_swebench(parsed: dict[str, str], repo: str, fail_to_pass, pass_to_pass) -> Grade:
    """swebench's verdict on parsed statuses: 1.0 iff its report is FULL (R2E-Gym's `_calculate_reward_swebench`).
    `missing` lists the named tests absent from the log, `mismatched` those present with a failing status."""
    constants, grading, _ = _swebench()
    eval_type = constants.EvalType.FAIL_ONLY if repo in constants.FAIL_ONLY_REPOS else constants.EvalType.PASS_AND_FAIL
    gold = {constants.FAIL_TO_PASS: list(fail_to_pass), constants.PASS_TO_PASS: list(pass_to_pass)}
    report = grading.get_eval_tests_report(parsed, gold, eval_type=eval_type)
    resolved = grading.get_resolution_status(report) == constants.ResolvedStatus.FULL.value
    failed = [t for part in (constants.FAIL_TO_PASS, constants.PASS_TO_PASS) for t in report[part]["failure"]]
    return Grade(
        1.0 if resolved else 0.0,
        dict(parsed),
        missing=sorted(t for t in failed if t not in parsed),
        mismatched={t: ("PASSED", parsed[t]) for t in sorted(failed) if t in parsed},
    )
