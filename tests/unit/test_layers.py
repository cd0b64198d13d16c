"""The trainer package is built in floors: a folder (or a top-level module) imports only from folders below it, never
from one above. Checked over every import, those inside functions too (a lazy import that runs back up is still a
dependency): the graph between folders must have no cycle, and docs/design.md's list of floors is the one the
imports give."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def folder_imports(package: Path) -> dict[str, dict[str, list[str]]]:
    """{unit: {imported unit: [where]}} over every import statement of `package`, a unit being a top-level module or
    a first-level folder of it (`trainer.rollout`), `where` the importing file and line."""
    name = package.name

    def unit(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != name or len(parts) < 2:
            return None
        top = package / parts[1]
        return f"{name}.{parts[1]}" if top.is_dir() or top.with_suffix(".py").exists() else None

    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        here = None if parts[1:] == ("__init__",) else unit(".".join(parts))
        if here is None:  # the package's own __init__, which imports nothing
            continue
        graph[here]  # a unit that imports nothing is still a floor-1 unit
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in {u for u in map(unit, targets) if u is not None and u != here}:
                graph[here][target].append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return graph


def floors(graph: dict[str, dict[str, list[str]]]) -> dict[str, int]:
    """Each unit's floor (1 + the highest floor it imports from); ValueError naming the imports of a cycle."""
    floor: dict[str, int] = {}

    def visit(u: str, path: tuple[str, ...]) -> int:
        if u in path:
            loop = path[path.index(u) :] + (u,)
            raise ValueError(
                "imports run in a circle: "
                + "; ".join(f"{a} -> {b} ({graph[a][b][0]})" for a, b in zip(loop, loop[1:], strict=False))
            )
        if u not in floor:
            floor[u] = 1 + max((visit(v, path + (u,)) for v in graph.get(u, {})), default=0)
        return floor[u]

    for u in sorted(graph):
        visit(u, ())
    return floor


def test_floors_find_a_circle_and_number_a_chain(tmp_path):
    pkg = tmp_path / "pkg"
    for folder in ("low", "mid", "high"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("import os\n")
    (pkg / "mid" / "b.py").write_text("from pkg.low.a import x\n")
    (pkg / "high" / "c.py").write_text("from pkg.mid import b\n\ndef f():\n    import pkg.low.a\n")
    (pkg / "top.py").write_text("from pkg.high.c import f\n")
    assert floors(folder_imports(pkg)) == {"pkg.low": 1, "pkg.mid": 2, "pkg.high": 3, "pkg.top": 4}
    # a lazy import back up, inside a function, closes a circle
    (pkg / "low" / "a.py").write_text("def g():\n    from pkg.high.c import f\n")
    try:
        floors(folder_imports(pkg))
    except ValueError as e:
        assert "pkg/low/a.py:2" in str(e) and "circle" in str(e)
    else:
        raise AssertionError("the circle low -> high -> mid -> low went unnoticed")


def test_no_folder_of_the_trainer_imports_from_a_floor_above_it_and_the_design_lists_the_floors():
    floor = floors(folder_imports(REPO / "trainer"))
    section = (REPO / "docs" / "design.md").read_text().split("**Floors**", 1)[1].split("| path |", 1)[0]
    listed = {
        f"trainer.{name}": int(n)
        for n, names in re.findall(r"^\s*(\d+)\. (.+)$", section, re.M)
        for name in re.findall(r"`([\w.]+?)(?:\.py|/)?`", names)
    }
    assert listed == floor, (
        f"docs/design.md's floors differ from the imports': {sorted(floor.items(), key=lambda kv: kv[1])}"
    )
