"""A batch's environment calls side by side: a bounded thread pool, results in input order.

A step of the swe environment waits seconds on its sandbox (a command in a container, a hidden test run), while
the rollout engine waits for every row of a decode step before the next forward pass; `rollout.env_workers`
environments reset, step, grade and close at once instead of one after another. Only environment calls go through
the pool: the engines keep tokenizing and all episode bookkeeping on their own thread, in row order, so the
episodes are the same for every width (each environment is its own object, and each is called by one thread at a
time, in the order the sequential loop would call it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class EnvPool:
    """`map(fn, items)` over at most `workers` threads; `workers == 1` calls `fn` on the caller's thread.

    Owned by whoever makes and closes the environments (the rollout driver, `play_tasks`), which passes it to the
    engine's `play`; one caller at a time. The threads start at the first call that has two items or more and
    stop at `close()`."""

    def __init__(self, workers: int = 1):
        if not (isinstance(workers, int) and workers >= 1):
            raise ValueError(f"EnvPool: workers must be an int >= 1, got {workers!r}")
        self.workers = workers
        self._executor: ThreadPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`[fn(x) for x in items]`, the calls side by side. Waits for every call, then raises the exception of the
        first item that raised (its own type), so no environment is still in use when the caller goes on."""
        items = list(items)
        if self.workers == 1 or len(items) < 2:
            return [fn(x) for x in items]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="env")
        futures = [self._executor.submit(fn, x) for x in items]
        wait(futures)
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SEQUENTIAL = EnvPool(1)
"""The pool of a caller that passes none: every call on the caller's thread, one after another."""


def close_envs(envs: Iterable, pool: EnvPool) -> None:
    """Close every environment through `pool` (the first error is raised after all were tried when width > 1)."""
    pool.map(lambda env: env.close(), envs)
