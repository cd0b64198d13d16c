"""Atomic file replacement: a reader sees the old file or the new one, never half of one.

The recipe (POSIX): write a temporary file in the *same directory* (so the rename cannot cross file
systems), fsync it (so its bytes are on disk before its name is), `os.replace` it over the target (atomic
on POSIX and on Windows), then fsync the directory (so the rename itself survives a power cut).

Temporary names start with a dot and end in ".tmp" (".metrics.parquet.k3j9x.tmp"), so globs for
"*.parquet" or "ckpt-*.pt" never pick one up. If the writer raises, the temporary file is removed; if the
process is killed (SIGKILL, OOM killer, power cut), one may be left behind, and `stale_temps` finds it for
the next writer of the same target to delete.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows cannot open a directory; its os.replace is durable enough for us
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on normal exit it replaces `path`, on an exception it is removed.

    Usage: `with atomic_path(p) as tmp: torch.save(obj, tmp)`. Parent directories are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # like tempfile.mkstemp, but with the umask's permissions (mkstemp's 0600 would stick to `path`)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        with open(tmp, "rb") as f:  # fsync flushes the file's data whatever the descriptor's mode
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def stale_temps(directory: str | os.PathLike, name_glob: str) -> list[Path]:
    """Temporary files that `atomic_path` left in `directory` for targets matching `name_glob` (e.g. "ckpt-*.pt")."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f".{name_glob}.*{TMP_SUFFIX}"))
