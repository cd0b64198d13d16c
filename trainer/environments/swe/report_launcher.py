"""The hardened grading's pytest launcher, run inside the sandbox under the task's own interpreter:

    python -I -B report_launcher.py KEY_FILE REPORT_FILE PYTEST_ARGS...

Why: the hidden tests import the agent's code, so whatever the agent wrote runs inside pytest's process and can
write to its log (fake "PASSED" lines from an atexit hook, a fake summary on pytest's saved descriptors, a failure
message that says "PASSED"). This launcher reads each test's outcome from pytest's own report objects, categorised
by pytest's own `pytest_report_teststatus`, and writes them to REPORT_FILE as JSON lines, each signed with an HMAC
under a key that only this process holds: it reads KEY_FILE and deletes it before pytest starts, so no code the
tests import can read it from disk. It records every function and class of pytest, pluggy, unittest and itself
(with their code objects) before pytest starts, checks at the end of pytest's start-up that no code of the
repository changed them, and, once collection begins, records the registered plugins (none may come from the
repository's code but its conftest files); before each test's call and at its report it checks that none of these
was replaced and no plugin of the repository added, and says so in the report if one was (a patched
`Function.runtest` or a plugin registered from the tested code forges outcomes without touching the log).
The session's end is a signed record with pytest's exit status, which the reader compares with the process's exit
code, so `os._exit(0)` mid-run leaves a report without its end.

What it does not stop (the tested code runs in this process, so no such launcher can close every way): code that
targets it (reads the key out of memory, patches the checks), attributes added rather than replaced (a new
property on pytest's report class), a patch that undoes itself before the next check, pluggy's hook callers
rewired on instances, a conftest.py of the repository where the test command honours conftest files (R2E-Gym's
does; the shipped images' does not), and values built to satisfy any assertion (an object whose `__eq__` is
always true). It stops the generic forgeries: the log's text, the process's exit, pytest's functions replaced, a
plugin registered from the tested code.

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


def _watch_list():
    """[(namespace, its attributes, name, object, function, code)] for every function, class and method of the
    watched packages now loaded (`function`: the object unwrapped from a static/class method or property)."""
    entries = []

    def add(namespace, name, value):
        func = _unwrapped(value)
        if callable(func):
            entries.append((namespace, vars(namespace), name, value, func, getattr(func, "__code__", None)))

    for module_name, module in sorted(sys.modules.items(), key=lambda item: item[0]):
        if module is None or (module_name.split(".")[0] not in WATCHED and module_name != __name__):
            continue
        for name, value in list(vars(module).items()):
            add(module, name, value)
            if isinstance(value, type) and getattr(value, "__module__", None) == module_name:
                for attr, member in list(vars(value).items()):
                    add(value, attr, member)
    return entries


def _changed(entries):
    """[(name, value now)] of watched entries that were rebound, deleted or given another code object."""
    changed = []
    for namespace, attributes, name, value, func, code in entries:
        if attributes.get(name, _changed) is not value or (code is not None and func.__code__ is not code):
            owner = getattr(namespace, "__qualname__", None) or getattr(namespace, "__name__", "?")
            changed.append((f"{owner}.{name}", attributes.get(name)))
    return changed


def _module_of(plugin):
    """The module a plugin comes from: a module's own name, a class's module, an instance's class's module."""
    if isinstance(plugin, type(sys)):
        return plugin.__name__
    return plugin.__module__ if isinstance(plugin, type) else type(plugin).__module__


def _file_of(module):
    return os.path.abspath(str(getattr(module, "__file__", None) or "/"))


def _from_pytest(module_name):
    return (module_name or "").split(".")[0] in ("_pytest", "pytest", "pluggy") or module_name == __name__


def _is_conftest(module):
    return isinstance(module, type(sys)) and os.path.basename(_file_of(module)) == "conftest.py"


def _code_file(value):
    """The file the code of a (possibly wrapped) function comes from; "" when it has none."""
    code = getattr(_unwrapped(value), "__code__", None)
    return os.path.abspath(code.co_filename) if code is not None else ""


class Reporter:
    """The pytest plugin that writes the signed report."""

    def __init__(self, key, out):
        self._key, self._out = key, out
        self._watched = _watch_list()
        self._loaded = set(sys.modules)
        self._seq = 0
        self._plugins = None
        self._config = None
        self._root = None
        self.tampered = []

    def _write(self, record):
        record["seq"] = self._seq
        self._seq += 1
        body = json.dumps(record, sort_keys=True)
        mac = hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()
        self._out.write(json.dumps({"record": body, "mac": mac}) + "\n")
        self._out.flush()

    def _check(self, where):
        found = [name for name, _ in _changed(self._watched)]
        if self._plugins is not None and self._config is not None:
            now = self._config.pluginmanager.get_plugins()
            if len(now) != len(self._plugins) or any(id(p) not in self._plugins for p in now):
                found += [f"a plugin registered after collection began: {_module_of(p)}" for p in now
                          if id(p) not in self._plugins and not self._allowed(p)]
        self._tamper(found, where)

    def _in_repository(self, path):
        """Whether code at `path` is the repository's: under the root, outside the interpreter's own environment
        (R2E-Gym's images keep it in /testbed/.venv; in a fresh grading container it comes from the image)."""
        python = tuple(os.path.join(p, "") for p in {sys.prefix, sys.exec_prefix, sys.base_prefix})
        return path.startswith(self._root) and not path.startswith(python)

    def _allowed(self, plugin):
        """A plugin pytest may hold: pytest's own, one installed with the interpreter (entry points), or a conftest.py
        of the repository, which pytest loads where the test command honours them (R2E-Gym's does; the shipped
        images' does not): all but code of the repository registered from elsewhere."""
        if _is_conftest(plugin) or _from_pytest(_module_of(plugin)):
            return True
        module = plugin if isinstance(plugin, type(sys)) else sys.modules.get(_module_of(plugin))
        return module is not None and not self._in_repository(_file_of(module))

    def _tamper(self, found, where):
        for name in found:
            if name not in self.tampered:
                self.tampered.append(name)
                self._write({"kind": "tampered", "what": name, "where": where})

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config):
        """After pytest's own start-up, before any test module is imported. The repository is on sys.path from
        pytest's `pythonpath` option on, and pytest imports a few modules after that (pdb, cmd, code), which the
        repository could shadow: so whatever changed since the launcher's first record must be pytest's own doing
        (its legacypath plugin patches `Config`), and no module of the repository may have been loaded since the
        launcher started (the interpreter's own environment aside: R2E-Gym's images keep it in /testbed/.venv).
        Then the record is taken again, to be checked from here on."""
        self._config = config
        self._write({"kind": "start", "pytest": pytest.__version__, "watched": len(self._watched)})
        self._root = os.path.join(str(getattr(config, "rootpath", None) or config.rootdir), "")
        self._tamper([name for name, now in _changed(self._watched) if self._in_repository(_code_file(now))],
                     "start-up")
        early = sorted(name for name, module in list(sys.modules.items()) if name not in self._loaded
                       and self._in_repository(_file_of(module)) and not _is_conftest(module))
        self._tamper(["modules of the repository imported before collection: " + ", ".join(early[:5])] if early
                     else [], "start-up")
        self._watched = _watch_list()

    def pytest_collection(self, session):
        plugins = session.config.pluginmanager.list_name_plugin()
        self._tamper([f"a plugin from the repository: {name}" for name, plugin in plugins
                      if plugin is not None and not self._allowed(plugin)], "collection")
        self._plugins = {id(p) for p in session.config.pluginmanager.get_plugins()}

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
        self._write({"kind": "finish", "exitstatus": int(exitstatus), "tampered": list(self.tampered)})


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
