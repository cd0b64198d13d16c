# Helpers of the workflow: config validation, the grid as a Paramspace, paths and the functions rules call.
# No rules here (Snakemake's linter wants functions and rules apart). Everything below runs when the DAG is
# built, so a bad config fails here, before any job starts.
#
# Results layout:
#   results/policies/{model}/                     warm-started base policy of a tiny family (+ {model}.yaml config)
#   results/cells/model=M/recipe=R/optimizer=O/seed=S/          (with an lr axis: .../optimizer=O/lr=L/seed=S/,
#                                                               with arms: .../optimizer=O/arm=A/seed=S/)
#       cell.yaml  metrics.parquet  episodes.parquet  train.log   (checkpoints/ only while the cell is unfinished)
#   results/summary.csv, summary.md, runs.parquet, results/logs/   figures/*.png, *.pdf
#   results/selected_lr.yaml                      (stability study: the selected lr per model and optimizer)
import json
import os
import re
import sys
from pathlib import Path

from snakemake.utils import Paramspace

# The checkout's own trainer package, whatever environment runs Snakemake (the study model needs no torch).
sys.path.insert(0, workflow.basedir)
import trainer  # noqa: E402
from trainer.study import (  # noqa: E402  (the study model: pure, tested on its own)
    OPTIMIZERS,
    RECIPE_OPTIMIZER,
    CellKey,
    Study,
    plain,
    yaml_text,
)
from trainer.analysis.kinds import STUDY_KINDS  # noqa: E402  (standard library only: no matplotlib here)

# Jobs inherit this process's environment (locally, and through sbatch on SLURM). Shell jobs run `python -m
# trainer`: without --software-deployment-method conda that `python` must be the interpreter running Snakemake
# (its virtual environment need not be activated); conda jobs put their own env first on PATH. Script jobs
# (summarize, figures) import `trainer.analysis`: the repository root on PYTHONPATH makes the working tree's
# trainer importable in any environment, installed or not.
os.environ.update(
    PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    PYTHONPATH=os.pathsep.join(filter(None, [workflow.basedir, os.environ.get("PYTHONPATH")])),
)

# The study, loaded once: its `base` study merged under it, checked as typed sections (trainer/study/schema.py StudyConfig:
# every key, type, range and rule across keys; defaults set), every cell checked, its paths rebased to its workdir.
STUDY_FILE = str((workflow.overwrite_configfiles or ["config.yaml"])[-1])
STUDY = Study.load(config, root=workflow.basedir, source=STUDY_FILE)
STUDY_CONFIG = STUDY.config
"""The checked study (trainer/study/schema.py StudyConfig): what the rules read, typed. Snakemake's `config` keeps
the file's keys as written; nothing here reads it after this line."""

GRID = STUDY.grid
PARAMSPACE = Paramspace(GRID, param_sep="=")
CELLS_DIR = "results/cells"
CELL = f"{CELLS_DIR}/{PARAMSPACE.wildcard_pattern}"
TRAINER_VERSION = trainer.TRAINER_VERSION
TRAINER_ENV = (
    "../../envs/trainer-gpu.yaml"
    if STUDY_CONFIG.cell.get("rollout", {}).get("engine") == "vllm"
    else "../../envs/trainer-cpu.yaml"
)
KIND = STUDY_KINDS[STUDY_CONFIG.study]
"""The study's kind (trainer/analysis/kinds.py): its figures and captions, what `summarize` writes beyond the
table and runs.parquet, the reference numbers it compares with and the params its functions take."""
PAPER_NUMBERS = {"paper_numbers": str(KIND.numbers)} if KIND.numbers else {}
"""The reference numbers the summary and figures compare with: an input, so that editing them redraws both."""


wildcard_constraints:
    model="|".join(re.escape(m) for m in STUDY_CONFIG.models),
    recipe="|".join(RECIPE_OPTIMIZER),
    optimizer="|".join(OPTIMIZERS),
    arm=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    lr=r"[0-9.]+e[+-][0-9]+",
    seed=r"\d+",


def metrics_files():
    """Every cell's metrics.parquet, in grid order: the explicit input list of the analysis rules."""
    return expand(f"{CELLS_DIR}/{{cell}}/metrics.parquet", cell=PARAMSPACE.instance_patterns)


def episode_files():
    """Every cell's episodes.parquet: an input of the summary too, so a deleted episode log reruns its cell."""
    return expand(f"{CELLS_DIR}/{{cell}}/episodes.parquet", cell=PARAMSPACE.instance_patterns)


def figure_files():
    return [f"figures/{name}.{ext}" for name in KIND.figures for ext in ("png", "pdf")]


def final_outputs():
    """What a plain `snakemake` builds: the summary table and every figure (they pull in every cell)."""
    return [
        "results/summary.csv",
        "results/summary.md",
        "results/runs.parquet",
        *KIND.extra_outputs.values(),
        *figure_files(),
    ]


def summary_report(path):
    """A summary file for the Snakemake report, with the study's caption."""
    return report(path, caption=f"../report/{KIND.summary_caption}.rst", category="Summary")


def figure_report(path):
    """One figure with its caption and category for the Snakemake report."""
    return report(path, caption=f"../report/{Path(path).stem}.rst", category=KIND.figures[Path(path).stem])


def figure_reports():
    """The figures rule's outputs, each with its caption and category for the Snakemake report."""
    return [figure_report(path) for path in figure_files()]


def preflight_options_json():
    """The cells' env.options as JSON for the preflight rule ("{}" where the study has no preflight)."""
    return json.dumps(STUDY.preflight_options or {})


def preflight_input(wildcards):
    """The preflight's table is an input of every cell of a study that plays its tasks in Docker, so no cell starts
    (and no GPU is booked) before the task file's rows are known to grade."""
    return ["results/preflight.tsv"] if STUDY.preflight_options is not None else []


def policy_input(wildcards):
    """The warm start is an input of a cell only for tiny families; a checkpoint path is not built by the DAG."""
    model = wildcards.model
    return [STUDY.model_path(model)] if STUDY.loads_warm_start(model) else []


def cell_yaml(wildcards):
    """The text of a cell's cell.yaml (a param, so a changed config marks the cell out of date)."""
    return yaml_text(STUDY.cell_config(CellKey.of(wildcards)), header="trainer config of this cell")


def warm_start_yaml(wildcards):
    return yaml_text(STUDY.warm_start_config(wildcards.model), header=f"warm start of {wildcards.model}")


def out_of_band_flag(wildcards):
    return "--allow-out-of-band" if STUDY_CONFIG.warm_start["allow_out_of_band"] else ""


def cells_dir(wildcards):
    """The Hive base folder of the cells (a function, not a literal: it is a prefix of the inputs)."""
    return CELLS_DIR


def analysis_params():
    """Parameters shared by summarize.py and plot_figures.py (`study` picks the kind; a kind that takes them
    also gets each model's horizon label)."""
    a = STUDY_CONFIG.analysis
    return dict(
        study=STUDY_CONFIG.study,
        collapse=a.collapse,
        models=STUDY_CONFIG.paper_names(),
        window_fraction=a.window_fraction,
        **({"horizons": STUDY_CONFIG.horizons()} if KIND.horizons else {}),
    )


def summarize_params():
    """analysis_params, and the study's preregistration where the kind judges one (an arms study)."""
    stated = STUDY_CONFIG.preregistration
    if KIND.preregistration and stated is not None:
        return dict(**analysis_params(), preregistration=plain(stated))  # a mapping: the script builds it again
    return analysis_params()


def figure_params():
    """analysis_params, and the EMA span of the curves where the kind's figures draw one."""
    return dict(**analysis_params(), **({"ema_span": STUDY_CONFIG.analysis.ema_span} if KIND.ema_span else {}))


# -- how a train job starts (rules/train.smk) ------------------------------------------------------------


def keep_flags(keep, out) -> str:
    """The trainer flags a cell's `keep:` asks for: its final policy into CELL/policy.partial (the rule renames it),
    a checkpoint after its last update."""
    flags = [f"--save-policy {out}/policy.partial"] if keep.policy else []
    return " ".join(flags + (["--checkpoint-last"] if keep.checkpoint else []))


def track_flags(trackers, out) -> str:
    """The trainer flags of the study's `trackers:`: each tracker on, the study file as the group, the cell's folder
    (`model=.../seed=S`) as the run's name."""
    names = [name for name, on in plain(trackers).items() if on]
    if not names:
        return ""
    cell = Path(out).relative_to(CELLS_DIR).as_posix()
    return f"--track {' '.join(names)} --track-group {Path(STUDY_FILE).stem} --track-name {cell}"


def trainer_launcher(res) -> str:
    """The command that starts `-m trainer train`: python; torchrun on one node; srun + torchrun on several.

    On several nodes, `srun` starts one torchrun per node, and each finds the rendezvous host, the step's first
    node, inside its own task (`SLURM_STEP_NODELIST`, set by srun on every node): the job's shell cannot say it,
    since the slurm jobstep plugin strips every SLURM_* variable but the job's id from it (SLURM_JOB_NODELIST
    included). The port follows the job id, so that two cells whose first node is the same one do not meet on
    one port. `--kill-on-bad-exit`: a node whose torchrun fails ends the step on the others too, rather than
    leaving them waiting in a collective; `--label` prefixes each line of train.log with its task (node) number."""
    procs, nodes = res.processes, res.nodes
    if nodes > 1:
        per_node = (
            "exec python -m torch.distributed.run "
            f"--nnodes={nodes} --nproc-per-node={procs} --rdzv-backend=c10d "
            '--rdzv-endpoint="$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n1)'
            ':$((20000 + SLURM_JOB_ID % 10000))" '
            '--rdzv-id="$SLURM_JOB_ID" "$@"'
        )
        return f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 --label bash -c '{per_node}' torchrun"
    if procs > 1:
        return f"python -m torch.distributed.run --standalone --nproc-per-node={procs}"
    return "python"


def train_placement(res) -> dict:
    """SLURM placement resources of a train job (the slurm executor plugin's names): GPUs on one node (`nodes: 1`,
    so that SLURM never spreads a torchrun's GPUs over two nodes), and for several nodes one task per node with
    the job's shell left to start its own `srun` (`mpi`); whole nodes with `exclusive`."""
    extra = {"slurm_extra": "--exclusive"} if res.exclusive else {}
    if res.nodes == 1:
        return {"gpu": res.gpu, "nodes": 1, **extra}
    placement = {"nodes": res.nodes, "tasks": res.nodes, "mpi": "srun", "tasks_per_gpu": 0, **extra}
    if res.gpu:
        placement["gres"] = f"gpu:{res.gpu}"
    return placement
