"""The scripted expert (for the supervised warm start and for tests), transcripts, and the vocabulary.

The expert knows the gold fix but acts only on what observations have shown: it searches for the issue's
function (`search def NAME`), opens it, follows the call chain function by function to the buggy line, edits it,
runs the tests and submits. With noise 0 it solves every task. With `noise` > 0 each action is, with that
probability, replaced by a plausible mistake: opening a wrong file, searching a wrong function, a wrong edit
(another mutation of the line it meant to fix, or of a line it has seen; sometimes a slip that leaves a syntax
error), or a submit without running the tests. It notices its own wrong edits only after a `test` ran, then
restores them, so noisy transcripts show the edit-test-repair loop; some noisy episodes fail (an untested
submit, the turn limit), which keeps warm-start data imperfect.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from trainer.environments.minirepo.env import COMMANDS, USAGE, MiniRepoEnv
from trainer.environments.minirepo.lang import KEYWORDS, OPS
from trainer.environments.minirepo.tasks import (
    BUG_KINDS,
    FILE_NAMES,
    FUNC_NAMES,
    LOCALS,
    PARAMS,
    MiniRepoConfig,
    MiniRepoTask,
    MiniRepoTasks,
    _mutations,
    _scope,
)


def _gold_line(task: MiniRepoTask, name: str, line: int) -> str:
    """What line `line` of file `name` says in the correct repository."""
    for bug in task.bugs:
        if (bug.file, bug.line) == (name, line):
            return bug.fixed
    return dict(task.files)[name][line - 1]


def _correct_action(env: MiniRepoEnv) -> str:
    """What a careful agent that knows the fix does next, given what the observations have shown so far."""
    task, files = env.task, env.files
    wrong = [(f, i) for f, i in sorted(env.edited) if files[f][i - 1] != _gold_line(task, f, i)]
    if wrong:  # its own bad edit: see it fail first, then put it right
        f, i = wrong[0]
        return f"edit {f} {i} {_gold_line(task, f, i)}" if env.tested else "test"
    for bug in task.bugs:
        if files[bug.file][bug.line - 1] == bug.fixed:
            continue
        for func, f, def_line, need in bug.chain:
            if func not in env.known_defs:
                return f"search def {func}"
            if (f, need) not in env.seen:
                start, view = def_line, env.config.view_lines
                while need >= start + view and all((f, i) in env.seen for i in range(start, start + view)):
                    start += view
                return f"open {f} {start}"
        return f"edit {bug.file} {bug.line} {bug.fixed}"
    return "submit" if env.tested else "test"


def _body(task: MiniRepoTask, name: str, def_line: int) -> range:
    """Line numbers of the body of the function whose `def` is line `def_line` of file `name` (through `ret`)."""
    lines = dict(task.files)[name]
    end = next(i for i in range(def_line + 1, len(lines) + 1) if lines[i - 1].startswith("ret "))
    return range(def_line + 1, end + 1)


def candidate_edits(task: MiniRepoTask, config: MiniRepoConfig, name: str, def_line: int) -> list[tuple]:
    """Every one-token fix a careful agent might try in a function, in a fixed order: its lines top to bottom,
    per line the configured bug kinds in order, per kind the alternatives in `_mutations`' order (`+ - *`)."""
    lines = dict(task.files)[name]
    out = []
    for i in _body(task, name, def_line):
        toks, scope = lines[i - 1].split(), _scope(lines, def_line, i)
        out += [(name, i, text) for kind in config.bug_kinds for text in _mutations(toks, scope, kind)]
    return out


def _search_action(env: MiniRepoEnv) -> str:
    """What a careful agent that does not know the fix does next: it finds the buggy function as the oracle does
    (at depth 0 that is the issue's own function), reads all of it, then tries `candidate_edits` one by one,
    each followed by `test FUNC` on the issue's function, putting a refuted line back before it moves to the
    next line; it submits once every issue's function passes its tests."""
    task, original = env.task, dict(env.task.files)
    changed = env.changes()
    owned = set()
    for bug in task.bugs:
        issue_func = bug.chain[0][0]
        func, name, def_line, _ = bug.chain[-1]
        body = _body(task, name, def_line)
        owned |= {(name, i) for i in body}
        mine = frozenset(c for c in changed if c[0] == name and c[1] in body)
        if mine and _verdict(env, issue_func, name, body, mine):
            continue  # fixed, as a test showed
        for chain_func, chain_file, chain_def, need in bug.chain:  # navigation, as the oracle
            if chain_func not in env.known_defs:
                return f"search def {chain_func}"
            last = need if chain_func != func else body[-1]
            if (chain_file, last) not in env.seen:
                start, view = chain_def, env.config.view_lines
                while last >= start + view and all((chain_file, i) in env.seen for i in range(start, start + view)):
                    start += view
                return f"open {chain_file} {start}"
        if mine and _verdict(env, issue_func, name, body, mine) is None:
            return f"test {issue_func}"
        refuted = {
            c
            for c in candidate_edits(task, env.config, name, def_line)
            if _verdict(env, issue_func, name, body, frozenset([c])) is False
        }
        todo = [c for c in candidate_edits(task, env.config, name, def_line) if c not in refuted]
        if not todo:
            break  # nothing left to try: give up on this issue
        for f, i, _ in sorted(mine):
            if i != todo[0][1]:
                return f"edit {f} {i} {original[f][i - 1]}"  # put a refuted line back first
        return f"edit {todo[0][0]} {todo[0][1]} {todo[0][2]}"
    stray = sorted((f, i) for f, i, _ in changed if (f, i) not in owned)
    if stray:  # an edit outside the functions under repair (a slip): undo it
        f, i = stray[0]
        return f"edit {f} {i} {original[f][i - 1]}"
    return "submit"


def _verdict(env: MiniRepoEnv, issue_func: str, name: str, body: range, lines: frozenset) -> bool | None:
    """Whether a test run showed `issue_func` passing (True) or failing (False) with exactly `lines` changed in
    the function's body (whatever else was changed), None if no run showed it."""
    seen = [
        v[issue_func]
        for changed, v in env.verdicts.items()
        if issue_func in v and frozenset(c for c in changed if c[0] == name and c[1] in body) == lines
    ]
    return None if not seen else any(seen)


def _mistake(env: MiniRepoEnv, correct: str, rng: random.Random) -> str:
    """A plausible wrong action in place of `correct`: wrong file, wrong search, wrong edit, or an untested submit."""
    kinds = ["open", "search", "edit"] + (["submit"] if correct == "test" else [])
    kind = rng.choice(kinds)
    if kind == "submit":
        return "submit"
    if kind == "edit":
        if correct.startswith("edit "):
            name, line = correct.split()[1], int(correct.split()[2])
        else:
            body = sorted((f, i) for f, i in env.seen if not env.files[f][i - 1].startswith("def "))
            name, line = rng.choice(body) if body else (None, 0)
        if name is not None:
            lines = env.files[name]
            def_line = max(i for i in range(1, line + 1) if lines[i - 1].startswith("def "))
            toks, scope = _gold_line(env.task, name, line).split(), _scope(lines, def_line, line)
            options = [m for k in BUG_KINDS for m in _mutations(toks, scope, k) if m != lines[line - 1]]
            if options:
                text = rng.choice(options)
                if rng.random() < 0.25:  # a slip that leaves a syntax error behind
                    text = text.rsplit(" ", 1)[0]
                return f"edit {name} {line} {text}"
        kind = "open"
    if kind == "search":
        return f"search {rng.choice(sorted(t.func for t in env.task.tests))}"
    name = rng.choice(sorted(env.files))
    return f"open {name} {rng.randint(1, len(env.files[name]))}"


def expert_action(env: MiniRepoEnv, rng: random.Random, noise: float = 0.0) -> str:
    """The scripted expert's next command for `env`'s current episode (`env.config.expert` says which expert);
    with probability `noise` a mistake."""
    if env.task is None or env.done:
        raise RuntimeError("expert_action needs an environment in the middle of an episode")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1], got {noise}")
    action = _search_action(env) if env.config.expert == "search" else _correct_action(env)
    return _mistake(env, action, rng) if noise > 0.0 and rng.random() < noise else action


@dataclass
class Transcript:
    """One episode: the instruction, then per turn the action and what the environment returned."""

    task_id: str
    instruction: str
    actions: list = field(default_factory=list)
    results: list = field(default_factory=list)

    @property
    def reward(self) -> float:
        return self.results[-1].reward if self.results else 0.0

    def text(self) -> str:
        """Instruction, actions and observations, one per line block (for tokenizer training)."""
        return "\n".join(
            [self.instruction] + [s for a, r in zip(self.actions, self.results) for s in (a, r.observation)]
        )


def play_expert(
    task: MiniRepoTask, config: MiniRepoConfig | None = None, noise: float = 0.0, rng: random.Random | None = None
) -> Transcript:
    """Play one episode of `task` with the expert."""
    env, rng = MiniRepoEnv(config), rng or random.Random(0)
    out = Transcript(task.task_id, env.reset(task))
    while not env.done:
        out.actions.append(expert_action(env, rng, noise))
        out.results.append(env.step(out.actions[-1]))
    return out


def sample_texts(config: MiniRepoConfig | None = None, n: int = 200, noise: float = 0.1, seed: int = 0) -> list:
    """Texts of `n` expert episodes on train tasks, to build or test a tokenizer."""
    source, rng = MiniRepoTasks(config), random.Random(seed)
    return [
        play_expert(t, source.config, noise, rng).text() for t in source.tasks("train", min(n, source.config.n_train))
    ]


def vocabulary() -> list[str]:
    """Every word that instructions, commands and observations use, except integers (digits with an optional
    leading `-`, which is also in the list): build a word-level tokenizer from this plus a digit rule."""
    words = {
        *COMMANDS,
        *KEYWORDS,
        *OPS,
        "=",
        ":",
        ",",
        *FUNC_NAMES,
        *FILE_NAMES,
        *PARAMS,
        *LOCALS,
        *" ".join(USAGE.values()).split(),
        *map(str, range(10)),
        *(
            "issue returns expected raises error pass fail invalid one per turn unknown command usage edited eof no "
            "match more submitted limit syntax duplicate timeout such file has lines name args depth "
            "overflow tests for"
        ).split(),
    }
    return sorted(words)
