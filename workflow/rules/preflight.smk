# Before any cell of a study that plays R2E-Gym-style tasks in Docker (env swe, backend docker): pull the task
# file's images and grade each repository's first rows, their own fix and no change, through the real sandbox and
# grader with the cells' settings (trainer/environments/swe/preflight.py). A CPU job: on SLURM it runs before any
# GPU is booked, and every train job waits for it. `snakemake preflight --configfile configs/paper.yaml` runs it
# alone. Below the study's `preflight.min_gold_share` it fails; its table is then in the log (Snakemake removes a
# failed job's outputs, not its log).


rule preflight:
    output:
        "results/preflight.tsv",
    log:
        "results/logs/preflight.log",
    conda:
        "../../envs/trainer-cpu.yaml"
    threads: STUDY_CONFIG.preflight.workers
    resources:
        mem_mb=STUDY_CONFIG.preflight.mem_mb,
        runtime=STUDY_CONFIG.preflight.runtime,
    params:
        options=preflight_options_json(),
        rows=STUDY_CONFIG.preflight.rows_per_repository,
        share=STUDY_CONFIG.preflight.min_gold_share,
    shell:
        "python -m trainer.environments.swe.preflight --options {params.options:q} --rows-per-repository "
        "{params.rows} --workers {threads} --min-gold-share {params.share} --out {output} > {log} 2>&1"
