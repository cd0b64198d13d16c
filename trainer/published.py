"""A study's results as checkable data: what `publish` commits under docs/results/<study>/ and what `compare` checks
a rerun against.

A published study is three files: `summary.csv` (the study's own summary table, as its summarize rule wrote it),
`runs.csv` (one row per run: the per-run numbers the summary is computed from, at full precision) and
`provenance.json` (trainer version, commit, study file and its SHA-256, machine, packages, cells, wall time). The
trainer version and commit come from the cells' own logs (each Parquet file carries its provenance); a cell logged
before the trainer version was recorded there gets the version its commit's `trainer/__init__.py` names.

`compare` takes a rerun (a study's results/, or a single cell's folder, judged with the published study's own
analysis settings), says why it is not bit-identical where how it was made differs (trainer version, CPU kind,
packages: `why_not_identical`), and then judges it at the level of distributions: are the rerun's seeds draws of
the distribution the published seeds came from? Each run is **identical**, **within**, **outside** (a Student-t
prediction test rejects, Holm-corrected over every test of the comparison), **untestable** (the published seeds
have no spread), **missing** or **extra**; it exits 0 when the rerun is consistent (nothing outside or missing).

    python -m trainer.published publish --results results --study config.yaml --out docs/results/default
    python -m trainer.published compare --results results --published docs/results/default
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
from scipy import stats

from trainer.analysis.cell_logs import load_metrics
from trainer.analysis.kinds import STUDY_KINDS
from trainer.analysis.statistics import holm
from trainer.atomic import atomic_path
from trainer.logs.parquet_log import PROVENANCE_KEY
from trainer.logs.provenance import kernel_kind, kernel_level
from trainer.rollout.config import RolloutConfig
from trainer.study import StudyConfig, check_study, resolve_base

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
REPO = Path(__file__).resolve().parents[1]
"""The checkout, where a published provenance's `study_file` is found."""
ALPHA = 0.05
"""The family-wise level of `compare`'s tests: an equivalent rerun is called outside at most this often."""
STATUSES = ("identical", "within", "untestable", "outside", "missing", "extra")


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
    kinds = pd.Series([_machine(p) for p in provs]).value_counts()
    return {
        "trainer_version": versions.pop(),
        "commits": commits,
        "study_file": str(study_file),
        "study_sha256": hashlib.sha256(study_file.read_bytes()).hexdigest(),
        "n_cells": len(paths),
        "machine": {
            k: first["hardware"].get(k)
            for k in (
                "processor",
                "cpu_features",
                "kernel_caps",
                "cpu_capability",
                "machine",
                "logical_cores",
                "cuda_devices",
            )
            if k in first["hardware"]
        },
        "machines": [{**json.loads(kind), "cells": int(count)} for kind, count in kinds.items()],
        "versions": first["versions"],
        "trained_utc": [min(p["timestamp_utc"] for p in provs), max(p["timestamp_utc"] for p in provs)],
        "wall_time_s": wall_time_s,
    }


def _machine(prov: dict) -> str:
    """A cell's CPU kind as a JSON key: processor and what picks its kernels (features, caps)."""
    hardware = prov.get("hardware", {})
    return json.dumps({"processor": hardware.get("processor"), **kernel_kind(hardware)})


def curves(results: Path) -> pd.DataFrame:
    """Every cell's training and held-out success per update (the run keys, update, success_rate, eval_success):
    what a collapse rule is judged on, so a later rule can be applied to a published study without its logs."""

    paths = sorted((results / "cells").rglob("metrics.parquet"))
    frame = load_metrics(paths, results / "cells", ("update", "success_rate", "eval_success"))
    return frame[[*_keys(frame), "update", "success_rate", "eval_success"]]


def publish(results: Path, study_file: Path, out: Path, repo: Path, wall_time_s: float | None = None) -> dict:
    """Write summary.csv, runs.csv, curves.csv, provenance.json (and an arms study's hypotheses.csv) of the study
    whose outputs are in `results` to `out`."""
    for name in ("summary.csv", "runs.parquet"):
        if not (results / name).exists():
            raise ValueError(f"{results / name}: missing; run the study's summarize rule first")
    provenance = study_provenance(results, study_file, repo, wall_time_s)
    runs = pd.read_parquet(results / "runs.parquet")
    _write(out / "summary.csv", (results / "summary.csv").read_text())
    _write(out / "runs.csv", runs.to_csv(index=False))  # pandas writes floats at full (repr) precision
    first = next((results / "cells").rglob("metrics.parquet"), None)
    if first is not None and "success_rate" in pq.read_schema(first).names:
        _write(out / "curves.csv", curves(results).to_csv(index=False))
    if (results / "hypotheses.csv").exists():
        _write(out / "hypotheses.csv", (results / "hypotheses.csv").read_text())
    _write(out / "provenance.json", json.dumps(provenance, indent=2) + "\n")
    return provenance


def published_study(provenance: dict, repo: Path = REPO) -> StudyConfig:
    """The study file a published study's provenance names, as the workflow read it (its `base` merged, checked,
    every default set)."""
    import yaml

    study_file = repo / provenance["study_file"]
    return check_study(resolve_base(yaml.safe_load(study_file.read_text()), root=repo, source=study_file), repo)


def recompute(folder: Path, repo: Path = REPO) -> pd.DataFrame:
    """A published study's summary.csv (and runs.csv's degradation verdicts; an arms study's predictors.csv)
    recomputed from its runs.csv with this checkout's analysis: its intervals, tests and verdicts, no retraining.
    Written in place; returns the summary."""
    from trainer.analysis.arms import predictor_table
    from trainer.analysis.collapse import degraded
    from trainer.analysis.pipeline import ANALYSES, settings_for

    runs, provenance = read_published(folder)
    study = published_study(provenance, repo)
    batch = study.cell.get("rollout", {}).get("batch_size", RolloutConfig.batch_size)
    runs["degraded"] = degraded(runs["gain"], float(batch), runs["n_updates"])
    settings = settings_for(STUDY_KINDS[study.study], models=study.paper_names())
    summary = ANALYSES[study.study].summary_table(runs, settings)
    _write(folder / "summary.csv", summary.to_csv(index=False, float_format="%.6g"))
    _write(folder / "runs.csv", runs.to_csv(index=False))
    if study.study == "arms":  # what predicts collapse, over runs and over arms
        _write(folder / "predictors.csv", predictor_table(runs).to_csv(index=False, float_format="%.6g"))
    return summary


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


def _consistency(new: np.ndarray, old: np.ndarray) -> tuple[float, str]:
    """(p, how) of the rerun's mean of `new` against the published seeds `old` as draws of one distribution: a
    Student-t prediction test, (mean_new - mean_old) / (s_old sqrt(1/n + 1/m)) on n - 1 df. NaN where the published
    seeds give no spread (one seed, or all equal): untestable."""
    n, m = len(old), len(new)
    spread = float(old.std(ddof=1)) if n > 1 else 0.0
    if spread == 0:
        return math.nan, "one published seed" if n < 2 else "the published seeds are all equal"
    t = (new.mean() - old.mean()) / (spread * math.sqrt(1 / n + 1 / m))
    return float(2 * stats.t.sf(abs(t), n - 1)), f"t = {t:+.2f} on {n - 1} df"


def compare(rerun: pd.DataFrame, published: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per run of either table: its keys, `status` and `detail`.

    A group (a run's keys but the seed) whose rerun numbers all equal the published ones is **identical**. Otherwise
    each compared number is tested: are the rerun's seeds draws of the distribution the published seeds came from
    (`_consistency`)? The p-values of every test of the comparison are Holm-corrected together, so that a rerun of
    many groups and numbers, all consistent, is called outside with probability at most `alpha`; a number whose
    corrected p is below it makes its group **outside**, else **within**; **untestable** where the published seeds
    give no spread and the numbers differ (not a failure: said). The collapse verdict is binary and told, not
    tested. **missing** / **extra**: published and not rerun, or the reverse."""
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
    tests: list[tuple[tuple, str, float, str]] = []  # (group, note, p, column)
    told: dict[tuple, list[str]] = {}
    for group, rows in merged[merged["_merge"] == "both"].groupby(group_keys, sort=False):
        group = group if isinstance(group, tuple) else (group,)
        pub_all = published.merge(pd.DataFrame([group], columns=group_keys), on=group_keys)
        for column in compared:
            new = rows[f"{column}_new"].dropna().to_numpy(dtype=float)
            old = pub_all[column].dropna().to_numpy(dtype=float)
            if len(new) == 0 or (len(new) == len(old) and np.array_equal(np.sort(new), np.sort(old))):
                continue
            if column == "collapsed":
                told.setdefault(group, []).append(
                    f"collapsed in {int(new.sum())} of {len(new)} rerun seeds, {int(old.sum())} of {len(old)} published"
                )
                continue
            p, how = _consistency(new, old)
            note = f"{column}: rerun mean {new.mean():.4g} vs published {old.mean():.4g} (sd {_sd(old)}), {how}"
            tests.append((group, note, p, column))
    adjusted = holm([p for _, _, p, _ in tests])
    outside: dict[tuple, list[str]] = {}
    untestable: dict[tuple, list[str]] = {}
    for (group, note, p, _), q in zip(tests, adjusted):
        if math.isnan(p):
            untestable.setdefault(group, []).append(f"{note}: untestable")
        elif q < alpha:
            outside.setdefault(group, []).append(f"{note}, p = {p:.2g} (Holm {q:.2g})")
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
        notes = told.get(group, [])
        if not differ:
            out.append({**key, "status": "identical", "detail": ""})
        elif group in outside:
            out.append({**key, "status": "outside", "detail": "; ".join(outside[group] + notes)})
        elif group in untestable:
            out.append({**key, "status": "untestable", "detail": "; ".join(untestable[group] + notes)})
        else:
            out.append({**key, "status": "within", "detail": "; ".join(["differs in " + ", ".join(differ), *notes])})
    return pd.DataFrame(out, columns=[*keys, "status", "detail"])


def _sd(values: np.ndarray) -> str:
    return f"{values.std(ddof=1):.3g}" if len(values) > 1 else "n/a"


PAD_ROW_FROZEN = ("165660f00c1d92516d1420d6f80032c09e965c50", "57d74530ef9d797193ff96c796a5839fafbe7cc7")
"""Commits from the first up to (not including) the second trained a tiny policy with its pad row's gradient zeroed
(a saved policy's pad id became the embedding's padding_idx): their cells differ from the rest of version 6's."""


def pad_row_frozen(commit: str, repo: Path) -> bool | None:
    """Whether `commit` trained tiny policies with the pad row frozen (None where git cannot say)."""

    def descends(ancestor: str) -> int:
        run = subprocess.run(
            ["git", "-C", str(repo), "merge-base", "--is-ancestor", ancestor, commit], capture_output=True
        )
        return run.returncode

    since, fixed = descends(PAD_ROW_FROZEN[0]), descends(PAD_ROW_FROZEN[1])
    return None if {since, fixed} - {0, 1} else (since == 0 and fixed == 1)


def why_not_identical(published: dict, rerun: list[dict], repo: Path | None = None) -> list[str]:
    """What differs between how the published cells and the rerun's were made: trainer version, the code's numerics
    within it (`PAD_ROW_FROZEN`, where `repo` can tell), CPU (processor and the features that change floating-point
    results), packages. A rerun is bit-identical only where none differs."""
    if not rerun:
        return []
    first = rerun[0]
    reasons = []
    version = first.get("trainer_version")
    if version is not None and version != published.get("trainer_version"):
        reasons.append(f"trainer version {version} vs published {published.get('trainer_version')}")
    commit = (first.get("git") or {}).get("commit")
    if repo is not None and commit and published.get("commits"):
        frozen = {pad_row_frozen(c, repo) for c in published["commits"]}
        frozen_here = pad_row_frozen(commit, repo)
        if None not in frozen | {frozen_here} and frozen != {frozen_here}:
            reasons.append(
                f"the published cells were trained {'with' if True in frozen else 'without'} a tiny policy's pad row "
                f"frozen (commits {PAD_ROW_FROZEN[0][:7]} up to {PAD_ROW_FROZEN[1][:7]}), this rerun "
                f"{'with' if frozen_here else 'without'}: the runs that train that row differ"
            )
    machine = published.get("machine", {})
    hardware = first.get("hardware", {})
    old, new = machine.get("cpu_features"), hardware.get("cpu_features")
    if old is None:
        reasons.append(
            f"the published provenance records no CPU features (processor {machine.get('processor')!r}): whether "
            f"this CPU ({hardware.get('processor')!r}, {', '.join(new or []) or 'no features recorded'}) is of the "
            "same kind is unknown"
        )
    elif new is not None and kernel_kind(machine) != kernel_kind(hardware):
        where = (
            f"published {machine.get('processor')!r} ({_kernels(machine)}); this rerun {hardware.get('processor')!r} "
            f"({_kernels(hardware)})"
        )
        level = kernel_level(machine)
        if level == kernel_level(hardware):
            reasons.append(
                f"another CPU kind, both at {level} kernels: {where}; identical only where every library's kernels "
                "match"
            )
        else:
            reasons.append(f"other kernels: {where} (every number may differ){_cap_hint(machine, hardware)}")
    for package, version in sorted((published.get("versions") or {}).items()):
        mine = (first.get("versions") or {}).get(package)
        if mine is not None and mine != version:
            reasons.append(f"{package} {mine} vs published {version}")
    machines = {json.dumps(kernel_kind(p.get("hardware", {}))) for p in rerun}
    if len(machines) > 1:
        reasons.append(f"the rerun's own cells ran on {len(machines)} CPU kinds")
    return reasons


def _kernels(hardware: dict) -> str:
    caps = " ".join(f"{k}={v}" for k, v in sorted((hardware.get("kernel_caps") or {}).items()))
    return ", ".join(hardware.get("cpu_features") or []) + (f"; capped {caps}" if caps else "")


AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
"""The caps that make an AVX-512 CPU run an AVX2 CPU's kernels."""


def _cap_hint(published: dict, rerun: dict) -> str:
    """How to run the published kernels on this AVX-512 CPU: the published caps, or AVX2 caps for an AVX2
    machine's cells."""
    caps = published.get("kernel_caps")
    if not caps and kernel_level(published) == "avx2" and kernel_level(rerun) == "avx512":
        caps = AVX2_CAPS
    if not caps or kernel_level(rerun) != "avx512":  # the caps this project knows of bring AVX-512 down
        return ""
    return "; to run the published kernels here, rerun with " + " ".join(f"{k}={v}" for k, v in caps.items())


def rerun_tables(path: Path, published: dict, repo: Path) -> tuple[pd.DataFrame, list[dict]]:
    """(runs, cell provenances) of a rerun: a study's results/ folder (its runs.parquet and cells) or one cell's
    folder (its metrics.parquet, judged here with the published study's analysis settings)."""
    if (path / "runs.parquet").exists():
        return pd.read_parquet(path / "runs.parquet"), _provenances(sorted((path / "cells").rglob("metrics.parquet")))
    if not (path / "metrics.parquet").exists():
        raise ValueError(
            f"{path}: neither a study's results/ (runs.parquet: missing; run the study's summarize rule first) "
            "nor a cell's folder (no metrics.parquet)"
        )
    return cell_run(path, published, repo), _provenances([path / "metrics.parquet"])


def _provenances(paths: list[Path]) -> list[dict]:
    """The cells' provenance, those that carry one (a log not written by the trainer has none to compare)."""
    found = []
    for path in paths:
        try:
            found.append(cell_provenance(path))
        except ValueError:
            continue
    return found


def cell_run(cell: Path, published: dict, repo: Path) -> pd.DataFrame:
    """The run table's row of one cell, as the published study's summarize rule would compute it (its kind, collapse
    rule, window and models from the study file the provenance names)."""
    from trainer.analysis.pipeline import judge_runs, settings_for

    study = published_study(published, repo)
    base = cell.resolve()
    while "=" in base.name:
        base = base.parent
    paths = [cell / "metrics.parquet"]
    settings = settings_for(
        STUDY_KINDS[study.study],
        study.analysis.collapse,
        study.paper_names(),
        study.analysis.window_fraction,
        horizons=study.horizons(),
        metrics_paths=paths,
    )
    return judge_runs(study.study, paths, base, settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.published", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish", help="write a finished study's summary, runs and provenance to a folder")
    pub.add_argument("--results", type=Path, required=True, help="the study's results/ folder")
    pub.add_argument("--study", type=Path, required=True, help="the study file it ran (config.yaml, configs/...)")
    pub.add_argument("--out", type=Path, required=True, help="e.g. docs/results/default")
    pub.add_argument("--wall-time-s", type=float, default=None, help="the study's measured wall time, recorded")
    rec = sub.add_parser("recompute", help="a published study's summary recomputed from its runs (no retraining)")
    rec.add_argument("published", type=Path, nargs="+", help="published study folders (docs/results/...)")
    cmp = sub.add_parser("compare", help="a rerun's runs against a published study (exit 1: outside or missing)")
    cmp.add_argument(
        "--results",
        type=Path,
        required=True,
        help="the rerun's results/ folder (its runs.parquet), or one cell's folder",
    )
    cmp.add_argument("--published", type=Path, required=True, help="e.g. docs/results/default")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish":
            prov = publish(args.results, args.study, args.out, REPO, args.wall_time_s)
            print(f"published {prov['n_cells']} cells (trainer version {prov['trainer_version']}) to {args.out}")
            return 0
        if args.command == "recompute":
            for folder in args.published:
                summary = recompute(folder)
                print(f"{folder}: {len(summary)} summary rows recomputed")
            return 0
        published, prov = read_published(args.published)
        runs, provs = rerun_tables(args.results, prov, REPO)
        table = compare(runs, published)
        if not (args.results / "runs.parquet").exists():  # one cell: its group's published seeds give the spread
            keys = [k for k in _keys(runs) if k != "seed"]
            table = table.merge(runs[keys].drop_duplicates(), on=keys)
            table = table[table["status"] != "missing"]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    reasons = why_not_identical(prov, provs, REPO)
    counts = table["status"].value_counts()
    print(", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES))
    differing = table[table["status"] != "identical"]
    if len(differing):
        if not provs:
            print("not bit-identical; the rerun's logs carry no provenance, so why cannot be said")
        elif reasons:
            print("not bit-identical, as expected where how the runs were made differs:")
            print("\n".join(f"  - {reason}" for reason in reasons))
        else:
            print("not bit-identical although nothing recorded differs (trainer version, CPU kind, packages)")
        with pd.option_context("display.max_colwidth", 400, "display.width", 250):
            print(differing.to_string(index=False))
    consistent = not counts.get("outside", 0) and not counts.get("missing", 0)
    print(
        "consistent with the published runs"
        if consistent
        else f"not consistent: a run outside the published spread at {ALPHA:.0%} (Holm-corrected), or missing"
    )
    return 0 if consistent else 1


if __name__ == "__main__":
    sys.exit(main())
