"""A study's results as checkable data: what `publish` commits under docs/results/<study>/ and what `compare` checks
a rerun against.

A published study is three files: `summary.csv` (the study's own summary table, as its summarize rule wrote it),
`runs.csv` (one row per run: the per-run numbers the summary is computed from, at full precision) and
`provenance.json` (trainer version, commit, study file and its SHA-256, machine, packages, cells, wall time). The
trainer version and commit come from the cells' own logs (each Parquet file carries its provenance); a cell logged
before the trainer version was recorded there gets the version its commit's `trainer/__init__.py` names.

`compare` joins a rerun's runs with the published ones on the run keys and judges each run: **identical** (every
number equal: what a bit-identical rerun gives), **within** (not identical, but the rerun's mean over seeds of each
number lies in the published seeds' 95% Student-t interval of that mean, the summary's own interval), **outside**
(a number's rerun mean lies outside it, or a group has one published seed, so no interval), **missing** (published,
not rerun) or **extra** (rerun, not published). It exits 1 when any run is outside or missing.

    python -m trainer.analysis.published publish --results results --study config.yaml --out docs/results/default
    python -m trainer.analysis.published compare --results results --published docs/results/default
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from trainer.analysis.statistics import t_interval
from trainer.atomic import atomic_path
from trainer.logs.parquet_log import PROVENANCE_KEY

COMPARED = (
    "window_success",
    "train_success_window",
    "final_window_success",
    "val_auc",
    "gain",
    "eval_success",
    "eval_first",
    "collapsed",
)
"""The per-run numbers `compare` checks, those of them a study's run table has: final-window training success
(`train_success_window` in the companion's table), learning, last and first held-out success, the companion's
final-window validation success and validation AUC, the collapse verdict."""
KEYS = ("model", "recipe", "optimizer", "arm", "lr", "seed")
"""Run keys, in order; `arm` only in a study of arms, `lr` only where the study has an lr axis."""
FILES = ("summary.csv", "runs.csv", "provenance.json")


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def cell_provenance(metrics_path: Path) -> dict:
    """The provenance a cell's metrics log carries (ValueError naming the file where it has none)."""
    meta = pq.read_schema(metrics_path).metadata or {}
    if PROVENANCE_KEY not in meta:
        raise ValueError(f"{metrics_path}: no provenance in the file's metadata (not written by the trainer?)")
    return json.loads(meta[PROVENANCE_KEY])


def version_at(commit: str, repo: Path) -> str:
    """TRAINER_VERSION as `trainer/__init__.py` names it at `commit` (ValueError where git cannot say)."""
    run = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:trainer/__init__.py"], capture_output=True, text=True
    )
    found = re.search(r'^TRAINER_VERSION = "([^"]+)"', run.stdout, flags=re.M) if run.returncode == 0 else None
    if found is None:
        raise ValueError(
            f"commit {commit}: cannot read its TRAINER_VERSION from git in {repo} "
            f"({run.stderr.strip() or 'no TRAINER_VERSION line'})"
        )
    return found.group(1)


def study_provenance(results: Path, study_file: Path, repo: Path, wall_time_s: float | None = None) -> dict:
    """What the published files record of how they were made; ValueError if the cells disagree on the trainer
    version or were written from a modified checkout."""
    paths = sorted((results / "cells").rglob("metrics.parquet"))
    if not paths:
        raise ValueError(f"{results / 'cells'}: no metrics.parquet under it")
    provs = [cell_provenance(p) for p in paths]
    dirty = [str(p) for p, prov in zip(paths, provs) if prov["git"].get("dirty")]
    if dirty:
        raise ValueError(
            f"{dirty[0]} (and {len(dirty) - 1} more): written from a checkout with uncommitted "
            f"changes, so no commit reproduces it"
        )
    commits = sorted({prov["git"]["commit"] for prov in provs})
    versions = {prov.get("trainer_version") or version_at(prov["git"]["commit"], repo) for prov in provs}
    if len(versions) != 1:
        raise ValueError(
            f"{results}: the cells were trained by trainer versions {sorted(versions)}; a published "
            f"study is one version"
        )
    first = provs[0]
    return {
        "trainer_version": versions.pop(),
        "commits": commits,
        "study_file": str(study_file),
        "study_sha256": hashlib.sha256(study_file.read_bytes()).hexdigest(),
        "n_cells": len(paths),
        "machine": {
            k: first["hardware"].get(k)
            for k in ("processor", "cpu_features", "machine", "logical_cores", "cuda_devices")
        },
        "versions": first["versions"],
        "trained_utc": [min(p["timestamp_utc"] for p in provs), max(p["timestamp_utc"] for p in provs)],
        "wall_time_s": wall_time_s,
    }


def publish(results: Path, study_file: Path, out: Path, repo: Path, wall_time_s: float | None = None) -> dict:
    """Write summary.csv, runs.csv and provenance.json of the study whose outputs are in `results` to `out`."""
    for name in ("summary.csv", "runs.parquet"):
        if not (results / name).exists():
            raise ValueError(f"{results / name}: missing; run the study's summarize rule first")
    provenance = study_provenance(results, study_file, repo, wall_time_s)
    runs = pd.read_parquet(results / "runs.parquet")
    _write(out / "summary.csv", (results / "summary.csv").read_text())
    _write(out / "runs.csv", runs.to_csv(index=False))  # pandas writes floats at full (repr) precision
    _write(out / "provenance.json", json.dumps(provenance, indent=2) + "\n")
    return provenance


def read_published(folder: Path) -> tuple[pd.DataFrame, dict]:
    """(runs, provenance) of a published study; ValueError naming what is missing."""
    missing = [name for name in FILES if not (folder / name).exists()]
    if missing:
        raise ValueError(f"{folder}: not a published study, missing {missing}")
    # labels as written: an arm "1e-3" stays a string and "NA" a label (to_csv writes a missing number as "")
    runs = pd.read_csv(folder / "runs.csv", dtype={"arm": str}, keep_default_na=False, na_values=[""])
    return runs, json.loads((folder / "provenance.json").read_text())


def _keys(frame: pd.DataFrame) -> list[str]:
    return [k for k in KEYS if k in frame.columns]


def _same(a, b) -> bool:
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def compare(rerun: pd.DataFrame, published: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One row per run of either table: its keys, `status` and `detail` (the numbers that differ and how)."""
    keys = _keys(published)
    if _keys(rerun) != keys:
        raise ValueError(f"the rerun's runs are keyed by {_keys(rerun)}, the published ones by {keys}")
    rerun, published = rerun.copy(), published.copy()
    for frame in (rerun, published):
        if "collapsed" in frame:
            frame["collapsed"] = frame["collapsed"].astype(float)
        if "lr" in keys:
            frame["lr"] = frame["lr"].astype(float)
    compared = [c for c in COMPARED if c in published.columns and c in rerun.columns]
    if not compared:
        raise ValueError(f"the two run tables share none of the compared numbers {list(COMPARED)}")
    merged = published.merge(rerun, on=keys, how="outer", suffixes=("_pub", "_new"), indicator=True)
    group_keys = [k for k in keys if k != "seed"]
    outside: dict[tuple, list[str]] = {}
    for group, rows in merged[merged["_merge"] == "both"].groupby(group_keys, sort=False):
        pub_all = published.merge(pd.DataFrame([group], columns=group_keys), on=group_keys)
        notes = []
        for column in compared:
            new = rows[f"{column}_new"].dropna().to_numpy(dtype=float)
            old = pub_all[column].dropna().to_numpy(dtype=float)
            if len(new) == 0 or (len(new) == len(old) and np.array_equal(np.sort(new), np.sort(old))):
                continue
            low, high = t_interval(old)
            if not low <= new.mean() <= high:
                interval = "one published seed: no interval" if math.isnan(low) else f"[{low:.4g}, {high:.4g}]"
                notes.append(f"{column}: mean {new.mean():.4g} vs published {old.mean():.4g}, interval {interval}")
        if notes:
            outside[group if isinstance(group, tuple) else (group,)] = notes
    out = []
    for _, row in merged.iterrows():
        key = {k: row[k] for k in keys}
        if row["_merge"] == "left_only":
            out.append({**key, "status": "missing", "detail": "published, not in the rerun"})
            continue
        if row["_merge"] == "right_only":
            out.append({**key, "status": "extra", "detail": "in the rerun, not published"})
            continue
        differ = [c for c in compared if not _same(row[f"{c}_pub"], row[f"{c}_new"])]
        group = tuple(row[k] for k in group_keys)
        if not differ:
            out.append({**key, "status": "identical", "detail": ""})
        elif group in outside:
            out.append({**key, "status": "outside", "detail": "; ".join(outside[group])})
        else:
            out.append({**key, "status": "within", "detail": "differs in " + ", ".join(differ)})
    return pd.DataFrame(out, columns=[*keys, "status", "detail"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.analysis.published", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish", help="write a finished study's summary, runs and provenance to a folder")
    pub.add_argument("--results", type=Path, required=True, help="the study's results/ folder")
    pub.add_argument("--study", type=Path, required=True, help="the study file it ran (config.yaml, configs/...)")
    pub.add_argument("--out", type=Path, required=True, help="e.g. docs/results/default")
    pub.add_argument("--wall-time-s", type=float, default=None, help="the study's measured wall time, recorded")
    cmp = sub.add_parser("compare", help="a rerun's runs against a published study (exit 1: outside or missing)")
    cmp.add_argument("--results", type=Path, required=True, help="the rerun's results/ folder (its runs.parquet)")
    cmp.add_argument("--published", type=Path, required=True, help="e.g. docs/results/default")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish":
            prov = publish(args.results, args.study, args.out, Path(__file__).resolve().parents[2], args.wall_time_s)
            print(f"published {prov['n_cells']} cells (trainer version {prov['trainer_version']}) to {args.out}")
            return 0
        runs_file = args.results / "runs.parquet"
        if not runs_file.exists():
            raise ValueError(f"{runs_file}: missing; run the study's summarize rule first")
        published, prov = read_published(args.published)
        from trainer import TRAINER_VERSION

        if prov["trainer_version"] != TRAINER_VERSION:
            print(
                f"note: {args.published} was measured with trainer version {prov['trainer_version']}, this "
                f"checkout is version {TRAINER_VERSION}: expect differences",
                file=sys.stderr,
            )
        table = compare(pd.read_parquet(runs_file), published)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = table["status"].value_counts()
    print(", ".join(f"{counts.get(s, 0)} {s}" for s in ("identical", "within", "outside", "missing", "extra")))
    differing = table[table["status"] != "identical"]
    if len(differing):
        print(differing.to_string(index=False))
    return 1 if counts.get("outside", 0) or counts.get("missing", 0) else 0


if __name__ == "__main__":
    sys.exit(main())
