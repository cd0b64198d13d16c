"""What the agent changed in its repository, and the repository the hidden tests run on.

Grading compares two trees, each a tar of /testbed without the environment (.venv), the history (.git), the hidden
tests' folder and bytecode: the image's original and the agent's. From them `plan_grading` says

* what the agent changed (added, modified, removed: `changed`), which tamper detection reads (`tamper.py`);
* the test infrastructure it touched, which grading **restores to the original** before the hidden tests run, as
  SWE-bench's harness checks the test files out again (R2E-Gym does not): every `conftest.py`, every test file by
  R2E-Gym's own rule (`is_test_file`: `test_*.py`, `*_test.py`, or a folder named test/tests/Test/Tests on the
  path), `pytest.ini` / `.pytest.ini`, and the pytest sections of `tox.ini` ([pytest]), `setup.cfg` ([tool:pytest])
  and `pyproject.toml` ([tool.pytest...]). An added one is left out, a removed one kept, a changed one restored.
  Files the row's own fix touches (its `parsed_commit_content`, outside R2E-Gym's test files) are exempt: there
  the hidden tests rely on the new version;
* what is left out of the copy and why: sparse files (a file whose blocks are fewer than its size, which a copy
  would inflate on the host), FIFOs and devices, and an entry in the way of a restored file.

The plan is then a delta over the original: `write` (the agent's added or changed entries, in path order so
parents come first), `rewrite` (config files whose pytest sections were put back: their new bytes) and `delete`
(the original's entries the agent removed). Applied to a fresh copy of the original it gives the agent's repository
with its test infrastructure restored, at a cost linear in what the agent changed; the copies out are linear in the
repository's real content (no sparse inflation, no per-path pattern matching).
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

OUT_OF_TREE = (".venv", ".git", "r2e_tests")
"""Top-level entries of /testbed that are not the agent's work: the environment and history come from the image,
the hidden tests from the grader."""

PYTEST_INI_FILES = ("pytest.ini", ".pytest.ini")
"""Files that are pytest's configuration as a whole."""
PYTEST_SECTIONS = {
    "tox.ini": re.compile(r"pytest$"),
    "setup.cfg": re.compile(r"tool:pytest$"),
    "pyproject.toml": re.compile(r"tool\.pytest(\..*)?$"),
}
"""Shared configuration files and the names of their pytest sections (a regular expression on the header)."""

_HEADER = re.compile(rb"^\s*\[\[?\s*([^\]]*?)\s*\]\]?\s*(?:[#;].*)?$")


def is_test_file(path: str) -> bool:
    """R2E-Gym's test-file rule (`FileDiff.is_test_file` in its commit models): a name `test_*` or `*_test.py`, or a
    folder named test, tests, Test or Tests on the path."""
    parts = path.split("/")
    return (
        path.endswith("_test.py")
        or parts[-1].startswith("test_")
        or any(part in ("test", "tests", "Test", "Tests") for part in parts[:-1])
    )


def is_test_infrastructure(path: str) -> bool:
    """Whether grading restores `path`: a conftest.py, a test file by R2E-Gym's rule, or a pytest configuration
    file (the shared ones only for their pytest sections)."""
    name = path.rsplit("/", 1)[-1]
    return name == "conftest.py" or name in PYTEST_INI_FILES or name in PYTEST_SECTIONS or is_test_file(path)


def _ignored(path: str) -> bool:
    """Bytecode is never work (grading removes it anyway); the out-of-tree folders are the grader's."""
    parts = path.split("/")
    return parts[0] in OUT_OF_TREE or "__pycache__" in parts or path.endswith((".pyc", ".pyo"))


@dataclass(frozen=True)
class Entry:
    """One path of a tree."""

    kind: str
    """"file", "dir", "symlink" or "other" (FIFO, device)."""
    mode: int
    size: int = 0
    digest: str = ""
    """sha256 of a file's bytes ("" for other kinds and for sparse files, which are not read)."""
    link: str = ""
    """A symlink's target."""
    sparse: bool = False

    def same_as(self, other: Entry) -> bool:
        if self.kind != other.kind or (self.mode & 0o7777) != (other.mode & 0o7777):
            return False
        if self.kind == "file":
            return not self.sparse and not other.sparse and self.digest == other.digest
        return self.link == other.link


class TarTree:
    """A tar file's entries by relative path (hard links read as the files they point to), and their bytes.

    The tar is the one `tar -C /testbed ... -cf - .` writes (names "./x"); bytecode and the out-of-tree folders are
    skipped. Every regular file is read once to hash it; sparse members are recorded, not read."""

    def __init__(self, source):
        """`source`: a path, or a seekable binary file positioned at the tar's start."""
        if isinstance(source, (str, Path)):
            self._tar = tarfile.open(source, "r:")
        else:
            self._tar = tarfile.open(fileobj=source, mode="r:")
        self.entries: dict[str, Entry] = {}
        self._members: dict[str, tarfile.TarInfo] = {}
        for member in self._tar:
            name = posixpath.normpath(member.name.lstrip("/"))
            if name in (".", "") or name.startswith("../") or _ignored(name):
                continue
            self._members[name] = member
            self.entries[name] = self._entry(member)
        self._tar.members = []  # the index above is all that is needed; keeps memory flat on large trees

    def _entry(self, member: tarfile.TarInfo) -> Entry:
        if member.isdir():
            return Entry("dir", member.mode)
        if member.issym():
            return Entry("symlink", member.mode, link=member.linkname)
        if member.isfile() or member.islnk():
            if member.issparse():
                return Entry("file", member.mode, member.size, sparse=True)
            digest = hashlib.sha256()
            handle = self._tar.extractfile(member)
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            return Entry("file", member.mode, member.size, digest.hexdigest())
        return Entry("other", member.mode)

    def read(self, path: str, limit: int | None = None) -> bytes:
        """A file's bytes (at most `limit`)."""
        handle = self._tar.extractfile(self._members[path])
        return handle.read() if limit is None else handle.read(limit)

    def member(self, path: str) -> tarfile.TarInfo:
        return self._members[path]

    def close(self) -> None:
        self._tar.close()

    def __enter__(self) -> TarTree:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tree_tar(root: str | Path, out) -> None:
    """Write the tar of the directory `root` (as `tar -C root -cf - .` would: names "./x", symlinks not followed)
    to the binary file `out`: the local backend's way to the same comparison."""
    root = Path(root)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root).as_posix()
            if _ignored(relative):
                continue
            tar.add(path, arcname="./" + relative, recursive=False)


@dataclass
class GradingPlan:
    """What grading does to a fresh copy of the original repository (see the module docstring)."""

    write: list[str] = field(default_factory=list)
    """The agent's entries to copy in (added, changed, or of another kind than the original's), parents first."""
    rewrite: dict[str, bytes] = field(default_factory=dict)
    """Shared configuration files with the agent's changes but the original's pytest sections: their bytes."""
    delete: list[str] = field(default_factory=list)
    """Original entries the agent removed, deepest first (folders last, removed only when empty)."""
    restored: list[str] = field(default_factory=list)
    """Test infrastructure the agent added, changed or removed, put back as it was."""
    dropped: list[tuple[str, str]] = field(default_factory=list)
    """(path, why) of agent entries not copied."""
    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[str]:
        """Every path the agent added, modified or removed."""
        return sorted({*self.added, *self.modified, *self.removed})

    def summary(self) -> dict:
        """The plan in a few counts and the restored and dropped paths (for the episode's info)."""
        return {
            "added": len(self.added),
            "modified": len(self.modified),
            "removed": len(self.removed),
            "restored": self.restored[:50],
            "dropped": [f"{path} ({why})" for path, why in self.dropped[:50]],
        }


def _sections(text: bytes, wanted: re.Pattern) -> tuple[list[bytes], list[bytes]]:
    """Split an INI or TOML file into (the lines outside the wanted sections, the wanted sections' lines)."""
    outside, inside = [], []
    current = outside
    for line in text.splitlines(keepends=True):
        header = _HEADER.match(line)
        if header:
            current = inside if wanted.match(header.group(1).decode(errors="replace").strip()) else outside
        current.append(line)
    return outside, inside


def _content(lines: list[bytes]) -> list[bytes]:
    return [line.rstrip() for line in lines if line.strip()]


def restore_pytest_sections(name: str, original: bytes | None, agent: bytes) -> bytes:
    """The agent's `tox.ini` / `setup.cfg` / `pyproject.toml` with its pytest sections replaced by the original's
    (removed where the original has none; the original's appended where the agent dropped them)."""
    wanted = PYTEST_SECTIONS[name]
    outside, _ = _sections(agent, wanted)
    original_outside, kept = _sections(original or b"", wanted)
    if original is not None and _content(outside) == _content(original_outside):
        return original  # only the pytest sections (or blank lines) changed: the original as it was
    text = b"".join(outside)
    if kept:
        if text and not text.endswith(b"\n"):
            text += b"\n"
        text += b"".join(kept)
    return text


def plan_grading(original: TarTree, agent: TarTree, exempt: Iterable[str] = ()) -> GradingPlan:
    """The delta that turns the original repository into the agent's with its test infrastructure restored
    (`exempt`: paths never restored, the row's own fix). See the module docstring."""
    exempt = set(exempt)
    plan = GradingPlan()
    old, new = original.entries, agent.entries
    restore = {p for p in old.keys() | new.keys() if is_test_infrastructure(p) and p not in exempt}
    for path in sorted(new):
        entry = new[path]
        before = old.get(path)
        if before is None:
            plan.added.append(path)
        elif not entry.same_as(before):
            plan.modified.append(path)
        else:
            continue
        name = path.rsplit("/", 1)[-1]
        if path in restore and entry.kind != "dir":
            if (
                name in PYTEST_SECTIONS
                and entry.kind == "file"
                and not entry.sparse
                and (before is None or before.kind == "file")
            ):
                original_bytes = original.read(path) if before is not None else None
                text = restore_pytest_sections(name, original_bytes, agent.read(path))
                if before is not None and text == original_bytes:
                    plan.restored.append(path)
                    continue
                plan.rewrite[path] = text
                if text != agent.read(path):
                    plan.restored.append(path)
                continue
            plan.restored.append(path)
            continue
        if entry.sparse:
            plan.dropped.append((path, f"a sparse file of {entry.size} bytes"))
        elif entry.kind == "other":
            plan.dropped.append((path, "not a file, folder or symlink"))
        else:
            plan.write.append(path)
            if before is not None and before.kind != entry.kind:
                plan.delete.append(path)  # the original's entry goes first (a file cannot be written over a folder)
    for path in sorted(old.keys() - new.keys()):
        plan.removed.append(path)
        if path in restore:
            plan.restored.append(path)
        else:
            plan.delete.append(path)
    # whatever is restored must keep its place: a file or symlink of the agent's where a restored path needs a
    # folder is left out, and the folders above a restored path are not removed
    kept = [p for p in plan.restored if p in old]
    needed = {posixpath.dirname(p) for p in kept}
    needed |= {a for p in needed for a in _ancestors(p)}
    inside = set(plan.restored)
    inside = tuple(p + "/" for p in inside)
    blocked = [p for p in plan.write if (p in needed and new[p].kind != "dir") or (inside and p.startswith(inside))]
    for path in blocked:
        plan.write.remove(path)
        plan.dropped.append((path, "in the way of restored test infrastructure"))
    plan.delete = [p for p in plan.delete if p not in needed and p not in blocked]
    plan.delete.sort(key=lambda p: (-p.count("/"), p))
    plan.restored.sort()
    return plan


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def delta_tar(plan: GradingPlan, original: TarTree, agent: TarTree, out) -> int:
    """Write the plan's `write` and `rewrite` entries as a tar to the binary file `out` (names "./x", owners and
    modes as the agent left them; hard links as plain files); returns the number of entries."""
    count = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted([*plan.write, *plan.rewrite]):
            member = agent.member(path)
            info = tarfile.TarInfo("./" + path)
            info.mode, info.uid, info.gid, info.mtime = member.mode, member.uid, member.gid, member.mtime
            info.uname, info.gname = member.uname, member.gname
            if path in plan.rewrite:
                data = plan.rewrite[path]
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif member.isdir():
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif member.issym():
                info.type, info.linkname = tarfile.SYMTYPE, member.linkname
                tar.addfile(info)
            else:
                info.size = agent.entries[path].size
                tar.addfile(info, agent._tar.extractfile(member))
            count += 1
    return count


def restore_in_place(plan: GradingPlan, original: TarTree, root: str | Path) -> None:
    """Put the plan's restored test infrastructure back into the agent's own repository at `root` (the local
    backend grades there): originals rewritten, added ones removed, shared config files rewritten."""
    import shutil

    root = Path(root)
    for path, data in plan.rewrite.items():
        (root / path).write_bytes(data)
    for path in plan.restored:
        target = root / path
        if path in plan.rewrite:
            continue
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        if path not in original.entries:
            continue
        entry = original.entries[path]
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.kind == "file":
            target.write_bytes(original.read(path))
            target.chmod(entry.mode & 0o777)
        elif entry.kind == "symlink":
            target.symlink_to(entry.link)
        elif entry.kind == "dir":
            target.mkdir(exist_ok=True)
