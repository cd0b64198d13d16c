"""`ast.parse` that threads can share.

CPython 3.11 keeps the AST constructor's recursion counter in the interpreter, not the thread: two threads parsing
at once (the preflight's gradings, an episode loop's tool calls) can interleave on it, and `ast.parse` then raises
`SystemError: AST constructor recursion depth mismatch` on valid code (CPython issue 106905 and its kin). One lock
around every parse in this package closes that; re-entrant, because a finalizer run by the collector mid-parse may
parse too.
"""

from __future__ import annotations

import ast
import threading

_PARSING = threading.RLock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, one thread at a time."""
    with _PARSING:
        return ast.parse(source, filename=filename)
