"""MiniRepoEnv: one episode of repository repair, spoken in the command language of the package docstring.

The environment keeps the working copy in memory (a dict of line lists), re-parses only edited files, and
evaluates hidden tests with the package's interpreter, so a step costs microseconds (no subprocess, no disk).
Besides the protocol it records what observations have revealed (`seen` lines, `known_defs`, `edited` lines,
`tested` since the last edit, and each test run's verdict per function in `verdicts`); the scripted experts read
these to act like an agent that only knows what it has been shown, and nothing in the observations depends on them.
"""

from __future__ import annotations

from trainer.environments.minirepo.lang import INT, EvalError, EvalTimeout, ProgramError, call, parse_file
from trainer.environments.minirepo.tasks import MiniRepoConfig, MiniRepoTask
from trainer.environments.protocol import StepInfo, StepResult

COMMANDS = ("ls", "open", "search", "edit", "run", "test", "submit")
USAGE = {
    "ls": "ls",
    "open": "open FILE LINE",
    "search": "search WORDS",
    "edit": "edit FILE LINE TEXT",
    "run": "run FUNC INT",
    "test": "test FUNC",
    "submit": "submit",
}


class MiniRepoEnv:
    """One episode at a time on a `MiniRepoTask`; speaks the command language of the module docstring."""

    def __init__(self, config: MiniRepoConfig | None = None):
        self.config = config or MiniRepoConfig()
        self.max_turns = self.config.max_turns
        self.task: MiniRepoTask | None = None
        self.done = True

    def reset(self, task: MiniRepoTask) -> str:
        """Load `task`'s buggy repository; returns the issue text."""
        if not isinstance(task, MiniRepoTask):
            raise TypeError(f"MiniRepoEnv.reset needs a MiniRepoTask, got {type(task).__name__}")
        self.task, self.turn, self.done = task, 0, False
        self.files = {name: list(lines) for name, lines in task.files}
        self._parsed: dict = {}
        self.known_defs: set = set()  # functions whose `def` line some observation showed
        self.seen: set = set()  # (file, line) pairs some observation showed
        self.edited: set = set()  # (file, line) pairs the agent replaced
        self.tested = False  # `test` ran since the last edit (whatever it printed)
        self.verdicts: dict = {}  # {changed lines: {func: all its tests passed}}, from every test run shown
        return task.instruction

    def close(self) -> None:
        """Nothing to release: the repository lives in memory."""
        self.done = True

    def step(self, action: str) -> StepResult:
        """Execute one command; see the module docstring for the language and the flags."""
        if self.task is None:
            raise RuntimeError("MiniRepoEnv.step called before reset")
        if self.done:
            raise RuntimeError("MiniRepoEnv.step called after the episode ended; call reset first")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        self.turn += 1
        toks = action.split()
        tool, invalid, error, timeout, reward, extra = "", False, False, False, 0.0, {"turn": self.turn}
        if not toks or len(action.strip().splitlines()) > 1:
            obs, invalid = "invalid : one command per turn", True
        elif toks[0] not in COMMANDS:
            obs, invalid = "invalid : unknown command", True
        elif not self._well_formed(toks):
            tool, obs, invalid = toks[0], f"invalid : usage {USAGE[toks[0]]}", True
        else:
            tool = toks[0]
            obs, error, timeout = getattr(self, f"_do_{tool}")(toks[1:])
            if tool == "submit":
                passed = self._grade()
                reward = 1.0 if all(passed) else 0.0
                for kind, flag in (("f2p", True), ("p2p", False)):
                    mine = [p for p, t in zip(passed, self.task.tests) if t.f2p == flag]
                    extra[f"{kind}_passed"], extra[f"{kind}_total"] = sum(mine), len(mine)
                self.done = True
        if not self.done and self.turn >= self.max_turns:
            obs, self.done, extra["truncated"] = obs + "\nturn limit", True, True
        return StepResult(obs, self.done, reward, StepInfo(tool, invalid, error or timeout, timeout, extra))

    @staticmethod
    def _well_formed(toks: list[str]) -> bool:
        cmd, args = toks[0], toks[1:]
        if cmd in ("ls", "submit"):
            return not args
        if cmd == "test":
            return len(args) <= 1
        if cmd == "open":
            return len(args) == 1 or (len(args) == 2 and bool(INT.match(args[1])))
        if cmd == "search":
            return len(args) >= 1
        if cmd == "edit":
            return len(args) >= 3 and bool(INT.match(args[1]))
        return len(args) >= 2 and all(INT.match(a) for a in args[1:])  # run

    def _show(self, name: str, start: int, stop: int) -> list[str]:
        """Numbered lines start..stop of `name`, noted as seen (and any `def` as a known definition)."""
        out = []
        for number in range(start, stop + 1):
            text = self.files[name][number - 1]
            self.seen.add((name, number))
            if text.startswith("def "):  # lines are single-spaced, so a name follows
                self.known_defs.add(text.split()[1])
            out.append(f"{number} {text}")
        return out

    def _locate(self, name: str, line: int | None):
        """An error message when (file, line) does not exist, else None."""
        if name not in self.files:
            return "error : no such file"
        if line is not None and not 1 <= line <= len(self.files[name]):
            return f"error : {name} has {len(self.files[name])} lines"
        return None

    def _do_ls(self, args):
        return " ".join(sorted(self.files)), False, False

    def _do_open(self, args):
        start = int(args[1]) if len(args) == 2 else 1
        problem = self._locate(args[0], start)
        if problem:
            return problem, True, False
        stop = min(start + self.config.view_lines - 1, len(self.files[args[0]]))
        shown = self._show(args[0], start, stop)
        return "\n".join(shown + (["eof"] if stop == len(self.files[args[0]]) else [])), False, False

    def _do_search(self, args):
        phrase = f" {' '.join(args)} "
        hits = [
            (name, i)
            for name in sorted(self.files)
            for i, text in enumerate(self.files[name], start=1)
            if phrase in f" {text} "
        ]
        if not hits:
            return "no match", False, False
        limit, shown = self.config.max_hits, []
        for name, i in hits[:limit]:
            self._show(name, i, i)
            shown.append(f"{name} {i} : {self.files[name][i - 1]}")
        return "\n".join(shown + ([f"more {len(hits) - limit}"] if len(hits) > limit else [])), False, False

    def _do_edit(self, args):
        line = int(args[1])
        problem = self._locate(args[0], line)
        if problem:
            return problem, True, False
        self.files[args[0]][line - 1] = " ".join(args[2:])
        self._parsed.pop(args[0], None)
        self.edited.add((args[0], line))
        self.tested = False
        return f"edited {args[0]} {line}", False, False

    def _program(self) -> dict:
        """The loaded repository {func: (params, body)}; raises ProgramError. Files are re-parsed only after edits."""
        program = {}
        for name in sorted(self.files):
            if name not in self._parsed:
                self._parsed[name] = parse_file(name, self.files[name])
            for func, entry in self._parsed[name].items():
                if func in program:
                    line = next(i for i, t in enumerate(self.files[name], 1) if t.split()[:2] == ["def", func])
                    raise ProgramError(name, line, "duplicate")
                program[func] = entry
        return program

    def _run_tests(self, tests=None):
        """Per test (default: all), the value it returned (None on a runtime error); raises ProgramError /
        EvalTimeout."""
        program, budget, got = self._program(), [self.config.eval_budget], []
        for test in self.task.tests if tests is None else tests:
            try:
                got.append(call(program, test.func, test.args, budget))
            except EvalError:
                got.append(None)
        return got

    def changes(self) -> frozenset:
        """The lines that differ from the task's repository, as (file, line, text)."""
        original = dict(self.task.files)
        return frozenset(
            (f, i, text)
            for f in sorted(self.files)
            for i, text in enumerate(self.files[f], 1)
            if text != original[f][i - 1]
        )

    def _do_test(self, args):
        self.tested = True  # whatever it prints, the agent has now seen the tests run on this code
        tests = [t for t in self.task.tests if not args or t.func == args[0]]
        if not tests:
            return f"error : no tests for {args[0]}", True, False
        verdict = self.verdicts.setdefault(self.changes(), {})
        try:
            got = self._run_tests(tests)
        except ProgramError as err:
            verdict.update({t.func: False for t in tests})
            return f"error : {err}", True, False
        except EvalTimeout:
            verdict.update({t.func: False for t in tests})
            return "error : timeout", True, True
        fails = [(t, g) for t, g in zip(tests, got) if g != t.want]
        failing = {t.func for t, _ in fails}
        verdict.update({t.func: t.func not in failing for t in tests})
        lines = [f"pass {len(got) - len(fails)} fail {len(fails)}"]
        for test, value in fails[: self.config.max_fail_lines]:
            outcome = "raises error" if value is None else f"returns {value}"
            lines.append(f"fail : {test.func} {' '.join(map(str, test.args))} {outcome} , expected {test.want}")
        return "\n".join(lines), False, False

    def _do_run(self, args):
        values = tuple(int(a) for a in args[1:])
        try:
            value = call(self._program(), args[0], values, [self.config.eval_budget])
        except (ProgramError, EvalError) as err:
            return f"error : {err}", True, False
        except EvalTimeout:
            return "error : timeout", True, True
        return f"{args[0]} {' '.join(map(str, values))} returns {value}", False, False

    def _do_submit(self, args):
        return "submitted", False, False

    def _grade(self) -> list[bool]:
        """Pass/fail per hidden test on the current code; a repository that does not load fails them all."""
        try:
            got = self._run_tests()
        except (ProgramError, EvalTimeout):
            return [False] * len(self.task.tests)
        return [g == t.want for t, g in zip(self.task.tests, got)]
