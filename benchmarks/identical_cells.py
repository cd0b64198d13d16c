"""Whether two trees make the same cells of every study: each study file's cell configs (cell.yaml) and warm-start
configs as the workflow writes them, for refactors of the study model that must leave every cell alone (dump in
two clones, then compare):

    python benchmarks/identical_cells.py dump --out before.json      # in the clone before the change
    python benchmarks/identical_cells.py dump --out after.json       # in the clone after it
    python benchmarks/identical_cells.py compare before.json after.json

`dump` loads each study file (config.yaml and configs/*.yaml, or those named) as the workflow does (`Study.load`
from the tree it runs in) and writes {study: {cells: {folder: config}, warm_starts: {model: config}}}; a study that
does not load here (a paper-scale checkpoint path that is absent) is written with its reason instead. `compare`
prints each study, cell or warm start that differs (the first key path that does) and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this tree's trainer, whatever is installed


def study_cells(study_file: Path, root: Path) -> dict:
    """{cells: {folder: cell config}, warm_starts: {model: warm-start config}} of one study file, or {error}."""
    import yaml

    from trainer.study import Study, StudyError

    try:
        study = Study.load(yaml.safe_load(study_file.read_text()), root=root, source=study_file)
    except StudyError as e:
        return {"error": str(e)}
    return {
        "cells": {key.folder: study.cell_config(key) for key in study.keys},
        "warm_starts": {model: study.warm_start_config(model) for model in study.warm_started},
    }


def first_difference(a, b, path: str = "") -> str | None:
    """The first key path where two JSON values differ, with both values, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}{key}: only in {'after' if key not in a else 'before'}"
            found = first_difference(a[key], b[key], f"{path}{key}.")
            if found:
                return found
        return None
    return None if a == b else f"{path.rstrip('.')}: {a!r} vs {b!r}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump", help="write every study's cells as this tree makes them")
    dump.add_argument("studies", nargs="*", type=Path, help="study files (default: config.yaml, configs/*.yaml)")
    dump.add_argument("--out", type=Path, required=True)
    compare = sub.add_parser("compare", help="name what differs between two dumps")
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "dump":
        files = args.studies or [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]
        out = {str(f.resolve().relative_to(REPO)): study_cells(f.resolve(), REPO) for f in files}
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True, default=str))
        cells = sum(len(v.get("cells", {})) for v in out.values())
        skipped = [name for name, v in out.items() if "error" in v]
        print(f"{cells} cells of {len(out) - len(skipped)} studies; not loaded here: {skipped or 'none'}")
        return 0
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    problems = []
    for study in sorted(set(before) | set(after)):
        why = first_difference(before.get(study, {}), after.get(study, {}))
        if study not in before or study not in after:
            why = f"only in {args.after if study not in before else args.before}"
        if why:
            problems.append(f"{study}: {why}")
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} of {len(set(before) | set(after))} studies differ")
        return 1
    print(f"identical: {sum(len(v.get('cells', {})) for v in before.values())} cells of {len(before)} study files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
