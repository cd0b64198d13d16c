"""The grader's pytest launcher, run inside the sandbox under the task's own interpreter:

    python report_launcher.py KEY_FILE REPORT_FILE PYTEST_ARGS...

It replaces `-m pytest` in the row's test script, so the tests run with the image's interpreter, folder, flags
and the repository's conftest files, as R2E-Gym runs them. Two jobs:

* **The outcomes from pytest's own objects, not the log's text.** Each test's outcome, as pytest's own
  `pytest_report_teststatus` categorises it, goes to REPORT_FILE as JSON lines, each signed (HMAC-SHA256) with a key
  read from KEY_FILE, which is deleted before pytest starts. A failure message saying "PASSED", fake summary lines
  printed at exit or written to pytest's saved descriptors change the log, not this report. The end of pytest's
  session is a signed record, so an exit mid-run leaves a report without its end.
* **Observations, not verdicts.** It records every function and class of pytest, pluggy, unittest and itself, the
  plugins and every hook caller's implementations, and reports what changed while the tests ran: a replaced,
  deleted or added attribute, a plugin or hook implementation registered, a standard-library module loaded from the
  repository; each with the file of the code responsible and its origin ("interpreter": the interpreter's own
  installation, pytest's own doing; "repository": under the root; "builtin": a function written in C; "other": no
  file, such as exec'd text). The grader decides (`tamper.dynamic_flags`): only changes made by files the agent
  changed, or by code of no file or C code, are flags, so a repository whose own conftest imports the package or
  registers its plugins is graded as it is.

What it cannot do: anything in this process can read its key (the object, its memory) and write a complete report,
patch what it checks with, or undo a patch before the next check. That is why a disagreement between this report
and the log's reading, and the static scan of the agent's changes, are flags too; see tamper.py.

Standard library and pytest only, Python 3.6 or later: it runs under the interpreter of the task's image.
"""
import hashlib
import hmac
import json
import os
import sys

import pytest

WATCHED = ("_pytest", "pytest", "pluggy", "unittest")
"""Packages whose functions and classes must not change while the tests run."""


def _unwrapped(value):
    func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    return func.fget if isinstance(func, property) else func


def _code_file(value):
    """The file the code of a (possibly wrapped) function comes from: its code object's, a class's module's, a
    partial's function's; "<builtin>" for functions written in C; "" for code of no file (exec'd text)."""
    value = _unwrapped(value)
    value = getattr(value, "func", value)  # functools.partial
    code = getattr(value, "__code__", None)
    if code is not None:
        return "" if code.co_filename.startswith("<") else os.path.abspath(code.co_filename)
    if isinstance(value, type):
        module = sys.modules.get(getattr(value, "__module__", ""))
        return _file_of(module) if module is not None and _file_of(module) else "<builtin>"
    return "<builtin>"


def _file_of(module):
    path = getattr(module, "__file__", None)
    return os.path.abspath(str(path)) if path else ""


def _watched_namespaces():
    """[(owner name, namespace dict)] of every module of the watched packages now loaded, and their classes."""
    spaces = []
    for module_name, module in sorted(sys.modules.items(), key=lambda item: item[0]):
        if module is None or (module_name.split(".")[0] not in WATCHED and module_name != __name__):
            continue
        spaces.append((module_name, vars(module)))
        for value in list(vars(module).values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == module_name:
                spaces.append((module_name + "." + value.__name__, vars(value)))
    return spaces


def _snapshot(spaces):
    """{(owner, name): (value, code)} of the namespaces."""
    taken = {}
    for owner, names in spaces:
        for name, value in list(names.items()):
            if callable(_unwrapped(value)):
                taken[(owner, name)] = (value, getattr(_unwrapped(value), "__code__", None))
    return taken


class Reporter:
    """The pytest plugin that writes the signed report and the observations."""

    def __init__(self, key, out):
        self._key, self._out = key, out
        self._spaces = _watched_namespaces()
        self._taken = _snapshot(self._spaces)
        self._loaded = set(sys.modules)
        self._seq = 0
        self._plugins = None
        self._impls = None
        self._config = None
        self._root = "/"
        self._seen = set()
        prefixes = set()
        for prefix in (sys.prefix, sys.exec_prefix, getattr(sys, "base_prefix", sys.prefix)):
            prefixes.add(os.path.join(os.path.realpath(prefix), ""))
            prefixes.add(os.path.join(os.path.abspath(prefix), ""))
        self._interpreter = tuple(prefixes) + tuple(
            os.path.join(os.path.dirname(_file_of(m)), "") for m in (pytest, sys.modules.get("_pytest"),
                                                                      sys.modules.get("pluggy")) if m is not None
        )
        self._stdlib = os.path.join(os.path.dirname(_file_of(os)), "")

    def _write(self, record):
        record["seq"] = self._seq
        self._seq += 1
        body = json.dumps(record, sort_keys=True)
        mac = hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()
        self._out.write(json.dumps({"record": body, "mac": mac}) + "\n")
        self._out.flush()

    def _origin(self, path):
        if path == "<builtin>":  # C code: pytest puts Python functions in its classes, never these
            return "builtin"
        if path == _file_of(sys.modules[__name__]):
            return "interpreter"
        if not path:
            return "other"
        real = os.path.realpath(path)
        if real.startswith(self._interpreter) or path.startswith(self._interpreter):
            return "interpreter"
        return "repository" if path.startswith(self._root) else "other"

    def _observe(self, what, path, where):
        if (what, path) in self._seen:
            return
        self._seen.add((what, path))
        self._write({"kind": "observed", "what": what, "file": path, "origin": self._origin(path), "where": where})

    def _check(self, where):
        """Observe whatever changed in the watched namespaces, the plugins and the hook callers since the last
        look, then take the state as it is now."""
        spaces = _watched_namespaces()
        now = _snapshot(spaces)
        for key, (value, code) in now.items():
            before = self._taken.get(key)
            if before is None:
                if key[0] in dict(self._spaces) and not key[1].startswith("__"):
                    self._observe("added " + ".".join(key), _code_file(value), where)
            elif before[0] is not value or (code is not None and before[1] is not code):
                self._observe("replaced " + ".".join(key), _code_file(value), where)
        namespaces = dict(spaces)
        for key in self._taken:
            if key not in now and key[0] in namespaces and key[1] not in namespaces[key[0]]:
                self._observe("deleted " + ".".join(key), "", where)
        self._spaces, self._taken = spaces, now
        if self._config is not None and self._plugins is not None:
            for plugin in self._config.pluginmanager.get_plugins():
                if id(plugin) not in self._plugins:
                    self._observe("registered a plugin", _file_of(self._module_of(plugin)), where)
            self._plugins = {id(p) for p in self._config.pluginmanager.get_plugins()}
            impls = self._hook_impls()
            for name, functions in impls.items():
                for function in functions - self._impls.get(name, set()):
                    self._observe("added an implementation of " + name, _code_file(function), where)
            self._impls = impls
        for name, module in list(sys.modules.items()):
            if name not in self._loaded and "." not in name and module is not None:
                path = _file_of(module)
                shadows = os.path.exists(os.path.join(self._stdlib, name + ".py")) or os.path.isdir(
                    os.path.join(self._stdlib, name))
                if shadows and path.startswith(self._root) and self._origin(path) == "repository":
                    self._observe(f"the standard module {name!r} loaded from the repository", path, where)
        self._loaded = set(sys.modules)

    def _hook_impls(self):
        impls = {}
        hooks = self._config.pluginmanager.hook
        for name in dir(hooks):
            caller = getattr(hooks, name, None)
            get = getattr(caller, "get_hookimpls", None)
            if name.startswith("pytest_") and get is not None:
                impls[name] = {impl.function for impl in get()}
        return impls

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config):
        """After pytest's start-up (the repository's conftest files loaded), before any test module is imported."""
        self._config = config
        self._root = os.path.join(str(getattr(config, "rootpath", None) or config.rootdir), "")
        self._write({"kind": "start", "pytest": pytest.__version__, "root": self._root})
        self._check("start-up")

    def pytest_collection(self, session):
        """The plugins and hook implementations pytest starts collecting with: those not of the interpreter's own
        installation (the repository's conftest files and the plugins they name, or whatever else registered one)
        are observed once, so that one from a file the agent changed is a flag; later ones by `_check`."""
        self._plugins = {id(p) for p in session.config.pluginmanager.get_plugins()}
        self._impls = self._hook_impls()
        for plugin in session.config.pluginmanager.get_plugins():
            path = _file_of(self._module_of(plugin))
            if self._origin(path) not in ("interpreter", "builtin"):
                self._observe("registered a plugin", path, "start-up")
        for name, functions in self._impls.items():
            for function in functions:
                path = _code_file(function)
                if self._origin(path) not in ("interpreter", "builtin"):
                    self._observe("an implementation of " + name, path, "start-up")

    @staticmethod
    def _module_of(plugin):
        if isinstance(plugin, type(sys)):
            return plugin
        return sys.modules.get(plugin.__module__ if isinstance(plugin, type) else type(plugin).__module__)

    def pytest_collection_finish(self, session):
        self._check("collection")
        self._write({"kind": "collected", "nodeids": [item.nodeid for item in session.items]})

    def pytest_collectreport(self, report):
        if report.failed or report.skipped:
            self._report(report, "collect")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
        self._check(item.nodeid)

    def pytest_runtest_logreport(self, report):
        if report.when == "call":  # setup's changes are seen before the call, teardown's before the next or at the end
            self._check(report.nodeid)
        self._report(report, report.when)

    def _report(self, report, when):
        category = self._config.hook.pytest_report_teststatus(report=report, config=self._config)[0]
        self._write({"kind": "report", "nodeid": report.nodeid, "when": when, "outcome": report.outcome,
                     "category": category})

    def pytest_sessionfinish(self, session, exitstatus):
        self._check("session end")
        self._write({"kind": "finish", "exitstatus": int(exitstatus)})


def main(argv):
    key_path, report_path, args = argv[1], argv[2], argv[3:]
    with open(key_path, "rb") as handle:
        key = handle.read().strip()
    os.unlink(key_path)
    if not key:
        sys.exit(f"report_launcher: the key file {key_path} is empty")
    import unittest  # noqa: F401  (watched: unittest-style tests report through it)
    if not sys.flags.isolated and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.getcwd()  # as `python -m pytest` has it (R2E-Gym's tests import the repository from there)
    with open(report_path, "a") as out:
        reporter = Reporter(key, out)
        status = pytest.main(args, plugins=[reporter])
    sys.exit(int(status))


if __name__ == "__main__":
    main(sys.argv)
