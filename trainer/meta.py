"""One contrast pooled over every published study that measured it, each run and each base policy counted once.

The same runs appear in several studies (a rerun on one CPU kind is bit-identical: the stability study's AdamW
cells are E1-rerun's and E1-minicpm's), and cited as separate confirmations they would be counted twice. Here:

* **A run is identified by its content** (`statistics.run_fingerprint` over its measured numbers at full
  precision): two published rows with the same numbers are one run, kept once.
* **A base policy is identified by what made it**: the model's preset, warm-start seed and options, its
  environment options, the trainer version and the CPU features of the machine that trained it (a warm start is
  bit-identical only on one CPU kind). A study whose provenance records no CPU features has bases of its own.
  Bases that share a run (by content) are one base.
* **The unit is the base policy**: per base, the mean over its runs of each arm, the difference of the two arms;
  pooled by a one-sample Student-t over the bases' differences, with the minimum detectable effect.

    python -m trainer.meta --first muon_m3e-4_r1e-4:spo_muon --second adamw_lr3e-4:spo_adam \\
        docs/results/edge* [--outcome window_success]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from trainer.analysis.statistics import Estimate, mean_estimate, run_fingerprint, welch_difference
from trainer.logs.provenance import kernel_kind
from trainer.published import published_study, read_published
from trainer.study import StudyConfig, deep_merge

FINGERPRINT_COLUMNS = (
    "recipe",
    "optimizer",
    "seed",
    "window_success",
    "gain",
    "eval_first",
    "eval_success",
    "heldout_auc",
    "update_rms",
    "approx_kl",
)
"""What identifies a run by content (those of them the table has): its recipe, optimizer and seed, and numbers
measured at full precision, which two different runs do not share."""


def base_keys(study: StudyConfig, provenance: dict, folder: Path) -> dict[str, str]:
    """Model -> the identity of the base policy its cells start from (see the module docstring)."""
    recorded = provenance.get("machine", {})
    machine = json.dumps(kernel_kind(recorded)) if recorded.get("cpu_features") else f"unrecorded machine of {folder}"
    keys = {}
    for name in study.models:
        model = study.models[study.policy_model(name)]
        if model.path:
            keys[name] = f"checkpoint {model.path}"
            continue
        made_of = {
            "preset": model.preset,
            "warm_start_seed": model.warm_start_seed,
            "warm_start": deep_merge(study.warm_start, model.warm_start or {}),
            "env": study.cell.get("env", {}),
            "env_options": model.env_options,
            "trainer_version": provenance.get("trainer_version"),
            "machine": machine,
        }
        keys[name] = json.dumps(made_of, sort_keys=True, default=str)
    return keys


def load_runs(folders: list[Path]) -> pd.DataFrame:
    """Every published run of `folders` with its `study`, `base` (merged where bases share a run) and
    `fingerprint`; a run published twice is kept once (its first study)."""
    frames = []
    for folder in folders:
        runs, provenance = read_published(folder)
        study = published_study(provenance)
        keys = base_keys(study, provenance, folder)
        runs = runs.assign(study=folder.name, base=runs["model"].map(keys))
        columns = [c for c in FINGERPRINT_COLUMNS if c in runs.columns]
        runs["fingerprint"] = [run_fingerprint(row, columns) for _, row in runs.iterrows()]
        frames.append(runs)
    runs = pd.concat(frames, ignore_index=True)
    # bases that share a run are one base: union-find over (base, fingerprint) links
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for _, group in runs.groupby("fingerprint"):
        bases = list(dict.fromkeys(group["base"]))
        for other in bases[1:]:
            parent[find(other)] = find(bases[0])
    runs["base"] = runs["base"].map(find)
    return runs.drop_duplicates("fingerprint", keep="first").reset_index(drop=True)


def select(runs: pd.DataFrame, spec: str) -> pd.DataFrame:
    """The runs a side of a contrast names: `ARM` or `ARM:RECIPE`, or `key=value,...` over the run table's columns
    (e.g. `recipe=spo_muon,lr=3e-4,model=qwen-h1`); ValueError naming a key no table has."""
    if "=" not in spec:
        arm, _, recipe = spec.partition(":")
        spec = f"arm={arm}" + (f",recipe={recipe}" if recipe else "")
    chosen = runs
    for term in spec.split(","):
        key, _, value = term.partition("=")
        if key not in runs.columns:
            raise ValueError(f"{spec!r}: no published run table has the key {key!r}")
        column = chosen[key]
        if pd.api.types.is_numeric_dtype(column):
            chosen = chosen[np.isclose(column.astype(float), float(value))]
        else:
            chosen = chosen[column.astype(str) == value]
    return chosen


def pooled_contrast(runs: pd.DataFrame, first: str, second: str, outcome: str) -> tuple[pd.DataFrame, Estimate]:
    """(per-base table, Estimate) of `first - second` on `outcome` (in points; see `select` for the specs). The
    unit is the base policy (paired within it: a one-sample t over the bases' differences); where the two sides
    share a single base, its seeds are the units (Welch's t between the two sides' runs)."""
    if outcome not in runs.columns:
        raise ValueError(f"no published run table has the outcome {outcome!r}")
    a, b = select(runs, first), select(runs, second)
    rows = []
    for base in sorted(set(a["base"]) & set(b["base"]), key=str):
        ra, rb = a[a["base"] == base], b[b["base"] == base]
        rows.append(
            {
                "studies": ", ".join(sorted(set(ra["study"]) | set(rb["study"]))),
                "model": ", ".join(sorted(set(ra["model"]) | set(rb["model"]))),
                "runs_first": len(ra),
                "runs_second": len(rb),
                "first_pct": 100 * ra[outcome].mean(),
                "second_pct": 100 * rb[outcome].mean(),
            }
        )
    table = pd.DataFrame(rows, columns=["studies", "model", "runs_first", "runs_second", "first_pct", "second_pct"])
    table["difference_pts"] = table["first_pct"] - table["second_pct"]
    if len(table) == 1:
        base = a["base"].isin(b["base"])
        return table, welch_difference(
            100 * a[base][outcome].dropna(), 100 * b[b["base"].isin(a["base"])][outcome].dropna()
        )
    return table, mean_estimate(table["difference_pts"].dropna().to_numpy())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.meta", description=__doc__.split("\n")[0])
    parser.add_argument("published", type=Path, nargs="+", help="published study folders (docs/results/...)")
    parser.add_argument(
        "--first", required=True, help="ARM, ARM:RECIPE or key=value,... (the contrast is first minus second)"
    )
    parser.add_argument("--second", required=True, help="ARM, ARM:RECIPE or key=value,...")
    parser.add_argument("--outcome", default="window_success", help="a column of the run tables")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.published)
        table, est = pooled_contrast(runs, args.first, args.second, args.outcome)
    except (ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if table.empty:
        print(f"no base policy ran both {args.first} and {args.second}")
        return 1
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(table.round(2).to_string(index=False))
    units = f"{est.n} base policies" if len(table) > 1 else f"one base policy's {est.n} runs (Welch)"
    print(
        f"{args.first} - {args.second} on {args.outcome}: {est.estimate:+.1f} points over {units}, "
        f"95% t interval [{est.low:.1f}, {est.high:.1f}], p = {est.p:.3g}, minimum detectable effect "
        f"{est.mde:.1f} points ({len(runs)} distinct runs read)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
