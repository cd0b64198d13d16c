"""Forgeries of the grade from inside the tests' own process, shared by the local and Docker grading tests.

Each is Python the agent appends to the modules its task's tests import (the files of the gold patch), leaving the
bug in place. Under R2E-Gym's log reading each gives reward 1 on an unfixed repository (the tests check that, so
none is a dud); under the default reading (the launcher's signed report) each must give 0.
"""

import re
import shlex

from trainer.environments.swe import format_action

_FAKE_SUMMARY = r'''
import ast as _ast, glob as _glob, os as _os

def _fake_summary():
    """pytest's summary header and a PASSED line for every test in the hidden test files (the cwd of the run)."""
    lines = ["=========================== short test summary info ============================"]
    for path in sorted(_glob.glob(_os.path.join(_os.getcwd(), "test_*.py"))):
        node_file = "r2e_tests/" + _os.path.basename(path)
        with open(path) as handle:
            tree = _ast.parse(handle.read())
        for node in tree.body:
            if isinstance(node, _ast.FunctionDef) and node.name.startswith("test"):
                lines.append("PASSED %s::%s" % (node_file, node.name))
            elif isinstance(node, _ast.ClassDef):
                lines += ["PASSED %s::%s::%s" % (node_file, node.name, m.name) for m in node.body
                          if isinstance(m, _ast.FunctionDef) and m.name.startswith("test")]
    return "\n".join(lines) + "\n"

_FAKE = _fake_summary() if _os.path.basename(_os.getcwd()) == "r2e_tests" else None
'''

FORGERIES = {
    "a failure message saying PASSED": r"""
def _forged(*args, **kwargs):
    raise RuntimeError("PASSED")

for _name, _value in list(globals().items()):
    if not _name.startswith("_") and callable(_value) and getattr(_value, "__module__", None) == __name__:
        globals()[_name] = _forged
""",
    "fake PASSED lines printed to stdout at exit": _FAKE_SUMMARY
    + r"""
import atexit as _atexit, sys as _sys
if _FAKE:
    _atexit.register(lambda: (_sys.stdout.write(_FAKE), _sys.stdout.flush()))
""",
    "fake PASSED lines printed to stderr at exit": _FAKE_SUMMARY
    + r"""
import atexit as _atexit, sys as _sys
if _FAKE:
    _atexit.register(lambda: (_sys.stderr.write(_FAKE), _sys.stderr.flush()))
""",
    "pytest's Function.runtest patched at import": r"""
import sys as _sys
if "_pytest.python" in _sys.modules:
    _sys.modules["_pytest.python"].Function.runtest = lambda self: None
""",
    "a fake summary on pytest's saved descriptors, then os._exit(0)": _FAKE_SUMMARY
    + r"""
import gc as _gc
if _FAKE:
    for _o in _gc.get_objects():
        if getattr(_o, "targetfd", None) in (1, 2) and isinstance(getattr(_o, "targetfd_save", None), int):
            _os.write(_o.targetfd_save, (_FAKE + "============ 9 passed in 0.01s ============\n").encode())
    _os._exit(0)
""",
    "a plugin registered from the tested code that turns failures into passes": r"""
import gc as _gc, sys as _sys
if "_pytest.config" in _sys.modules:
    import pytest as _pytest

    class _Passer:
        @_pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            report = outcome.get_result()
            report.outcome, report.longrepr = "passed", None

    for _o in _gc.get_objects():
        if type(_o).__name__ == "PytestPluginManager":
            _o.register(_Passer())
""",
}


def forge_actions(task, repo_dir: str, forgery: str) -> list[str]:
    """The agent's actions: append the forgery to every module of the task's gold patch, then submit."""
    names = re.findall(r"^\+\+\+ b/(\S+)", task.gold_patch, re.M)
    code = FORGERIES[forgery]
    append = " && ".join(f"printf '%s' {shlex.quote(code)} >> {shlex.quote(f'{repo_dir}/{name}')}" for name in names)
    return [format_action("execute_bash", {"cmd": append}), format_action("finish", {"command": "submit"})]
