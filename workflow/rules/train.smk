# One training job per cell of the grid. The cell's trainer config is written first (a local rule), so the
# folder holds everything needed to rerun the cell by hand:
#     python -m trainer train --config results/cells/.../cell.yaml --out /tmp/cell
# A `shell:` rule, not `run:`: Snakemake runs a local `run:` job in a freshly spawned snakemake process (~3 s,
# plus up to 10 s more where the slurm plugin's `scontrol` finds no controller), a shell job in a thread.


rule cell_config:
    output:
        f"{CELL}/cell.yaml",
    log:
        f"results/logs/cell_config/{PARAMSPACE.wildcard_pattern}.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"  # only bash's printf: any env of the study will do
    params:
        text=cell_yaml,
    shell:
        "printf '%s' {params.text:q} > {output} && echo 'wrote {output}' > {log}"


# `--resume` continues a killed cell from its newest checkpoint (snakemake --rerun-incomplete, --retries).
# The checkpoints carry a key (trainer version + hash of cell.yaml + hash of the warm-started policy's report,
# which a rebuilt warm start always changes): checkpoints written under another key are deleted first, and a
# finished cell deletes its own, so a forced rerun, a TRAINER_VERSION bump or a new base policy starts from
# scratch. The trainer itself also refuses a checkpoint of a different config.
# `keep:` (trainer/study/schema.py KeepConfig): the final policy is written beside the logs as policy/ (through a
# temporary folder, so a policy/ is always whole) and the last update's checkpoint moved to last_checkpoint/.
# `--exit-with $PPID`: the job's shell is a child of the process running it (the head locally, the job's own
# snakemake on SLURM); the trainer stops when that process is gone, so a killed head leaves no orphan training.
# On several nodes that pid is the batch host's, which the other nodes do not have: there each trainer watches
# its own parent instead (`--exit-with parent`: its node's torchrun, which srun started and SLURM ends with the
# job), so a watchdog runs on every node without looking across nodes (trainer/__main__.py exit_with).
# `cpus_per_task`: on SLURM, Snakemake caps `threads` at the head's --cores, while run.threads in cell.yaml is
# the study's value; the plugin takes this resource as given, so the job gets the CPUs the trainer will use
# (threads x processes when the update is sharded).
# Several processes (`resources.train.processes`, `nodes`): the trainer runs under torchrun (`trainer_launcher`),
# one process per GPU, the update sharded with FSDP2; on several nodes under `srun`, one torchrun per node.


rule train:
    input:
        cell=f"{CELL}/cell.yaml",
        policy=policy_input,
        preflight=preflight_input,
    output:
        metrics=f"{CELL}/metrics.parquet",
        episodes=f"{CELL}/episodes.parquet",
    log:
        f"{CELL}/train.log",
    conda:
        TRAINER_ENV
    threads: STUDY_CONFIG.resources.train.threads * STUDY_CONFIG.resources.train.processes
    resources:
        **train_placement(STUDY_CONFIG.resources.train),
        cpus_per_task=STUDY_CONFIG.resources.train.threads * STUDY_CONFIG.resources.train.processes,
        mem_mb=STUDY_CONFIG.resources.train.mem_mb,
        runtime=STUDY_CONFIG.resources.train.runtime,
    params:
        out=subpath(output.metrics, parent=True),
        trainer_version=TRAINER_VERSION,
        launcher=trainer_launcher(STUDY_CONFIG.resources.train),
        keep=lambda wildcards, output: keep_flags(STUDY_CONFIG.keep, Path(output.metrics).parent),
        track=lambda wildcards, output: track_flags(STUDY_CONFIG.trackers, Path(output.metrics).parent),
        keep_checkpoint="yes" if STUDY_CONFIG.keep.checkpoint else "no",
        exit_with="parent" if STUDY_CONFIG.resources.train.nodes > 1 else "$PPID",
    shell:
        """
        policy=""
        for p in {input.policy}; do policy="$(sha256sum < "$p/warm_start.json" | cut -c1-64)"; done
        key="{params.trainer_version} $(sha256sum < {input.cell} | cut -c1-64) $policy"
        if [ "$(cat {params.out}/checkpoints/RESUME_KEY 2>/dev/null)" != "$key" ]; then
            rm -rf {params.out}/checkpoints
        fi
        mkdir -p {params.out}/checkpoints && echo "$key" > {params.out}/checkpoints/RESUME_KEY
        rm -rf {params.out}/policy.partial
        {params.launcher} -m trainer train --config {input.cell} --out {params.out} --resume --no-progress \
            --exit-with {params.exit_with} {params.keep} {params.track} > {log} 2>&1
        if [ -d {params.out}/policy.partial ]; then
            rm -rf {params.out}/policy && mv {params.out}/policy.partial {params.out}/policy
        fi
        if [ {params.keep_checkpoint} = yes ]; then  # --checkpoint-last wrote one after the last update
            last="$(ls -d {params.out}/checkpoints/ckpt-* | sort | tail -n1)"
            rm -rf {params.out}/last_checkpoint && mkdir {params.out}/last_checkpoint
            mv "$last" {params.out}/last_checkpoint/
        fi
        rm -rf {params.out}/checkpoints
        """
