"""The tiny language MiniRepo's code is written in: a parser and an interpreter, so tests really execute.

A function is a `def NAME PARAM...` line, assignments `VAR = EXPR`, and a closing `ret EXPR`; an EXPR is an
atom (variable or integer), `ATOM OP ATOM` with OP in `+ - *`, or a call `FUNC ATOM...`. Names are global;
files are only containers. The interpreter is a plain recursive walk over pre-parsed tuples (fast enough that
a full test run costs tens of microseconds). Guards keep every outcome short and finite: values beyond +-99999
and recursion deeper than 32 are runtime errors, and a step budget shared by one command's calls turns runaway
(e.g. exponential) recursion into a timeout instead of a hang.
"""

from __future__ import annotations

import re

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
KEYWORDS = frozenset({"def", "ret"})
VALUE_LIMIT = 99_999
MAX_CALL_DEPTH = 32
IDENT = re.compile(r"[a-z][a-z0-9]*\Z")
INT = re.compile(r"-?[0-9]+\Z")


class ProgramError(Exception):
    """The repository does not load: a malformed line or a duplicate definition, at (file, line)."""

    def __init__(self, file: str, line: int, what: str):
        super().__init__(f"{what} {file} {line}")
        self.file, self.line, self.what = file, line, what


class EvalError(Exception):
    """A call failed at run time (unknown name, wrong argument count, recursion too deep, overflow)."""


class EvalTimeout(Exception):
    """The evaluation used up its step budget."""


def _atom(tok: str):
    if INT.match(tok):
        return int(tok)
    if IDENT.match(tok) and tok not in KEYWORDS:
        return tok
    return None


def _expr(toks: list[str]):
    """Parse an expression into ("a", atom) | ("b", op, atom, atom) | ("c", func, atoms); None if malformed."""
    atoms = [_atom(t) for t in toks]
    if len(toks) == 1:
        return None if atoms[0] is None else ("a", atoms[0])
    if len(toks) == 3 and toks[1] in OPS:
        return None if atoms[0] is None or atoms[2] is None else ("b", OPS[toks[1]], atoms[0], atoms[2])
    if isinstance(atoms[0], str) and all(a is not None for a in atoms[1:]):
        return ("c", atoms[0], tuple(atoms[1:]))
    return None


def parse_file(name: str, lines) -> dict:
    """Functions of one file: {func: (params, body)}; body is ((target or None, expr), ...) ending in `ret`."""
    funcs, current, params, body = {}, None, (), []
    for number, text in enumerate(lines, start=1):
        toks = text.split()
        if toks and toks[0] == "def":
            if current is not None:
                raise ProgramError(name, number, "syntax")
            params = tuple(toks[2:])
            ok = len(toks) >= 3 and all(IDENT.match(t) and t not in KEYWORDS for t in toks[1:])
            if not ok or len(set(params)) != len(params):
                raise ProgramError(name, number, "syntax")
            if toks[1] in funcs:
                raise ProgramError(name, number, "duplicate")
            current, body = toks[1], []
            continue
        if current is None:
            raise ProgramError(name, number, "syntax")
        if toks and toks[0] == "ret":
            target, expr = None, _expr(toks[1:]) if len(toks) > 1 else None
        elif len(toks) >= 3 and toks[1] == "=" and IDENT.match(toks[0]) and toks[0] not in KEYWORDS:
            target, expr = toks[0], _expr(toks[2:])
        else:
            expr = None
        if expr is None:
            raise ProgramError(name, number, "syntax")
        body.append((target, expr))
        if target is None:
            funcs[current], current = (params, tuple(body)), None
    if current is not None:
        raise ProgramError(name, len(lines), "syntax")
    return funcs


def call(program: dict, func: str, args: tuple, budget: list, depth: int = 0) -> int:
    """Evaluate `func(*args)`; `budget` is a one-element list of steps left, shared by nested calls."""
    entry = program.get(func)
    if entry is None:
        raise EvalError(f"name {func}")
    params, body = entry
    if len(args) != len(params):
        raise EvalError(f"args {func}")
    if depth > MAX_CALL_DEPTH:
        raise EvalError("depth")
    env = dict(zip(params, args))
    for target, expr in body:
        budget[0] -= 1
        if budget[0] < 0:
            raise EvalTimeout()
        try:
            kind = expr[0]
            if kind == "b":
                a, b = expr[2], expr[3]
                value = expr[1](a if type(a) is int else env[a], b if type(b) is int else env[b])
            elif kind == "a":
                value = expr[1] if type(expr[1]) is int else env[expr[1]]
            else:
                value = call(
                    program, expr[1], tuple(a if type(a) is int else env[a] for a in expr[2]), budget, depth + 1
                )
        except KeyError as err:
            raise EvalError(f"name {err.args[0]}") from None
        if not -VALUE_LIMIT <= value <= VALUE_LIMIT:
            raise EvalError("overflow")
        if target is None:
            return value
        env[target] = value
    raise EvalError(f"ret {func}")  # unreachable for parsed bodies, which always end in `ret`
