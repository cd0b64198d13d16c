# Warm start: a supervised base policy per tiny model family (embedded scale). Paper-scale families name a
# checkpoint `path` instead and have no warm start.


rule warm_start_config:
    output:
        "results/policies/{model}.yaml",
    log:
        "results/logs/warm_start_config/{model}.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"  # only bash's printf: any env of the study will do
    params:
        text=warm_start_yaml,
    shell:  # not `run:`: see rule cell_config
        "printf '%s' {params.text:q} > {output} && echo 'wrote {output}' > {log}"


rule warm_start:
    input:
        config="results/policies/{model}.yaml",
    output:
        directory("results/policies/{model}"),
    log:
        "results/logs/warm_start/{model}.log",
    conda:
        TRAINER_ENV
    threads: STUDY_CONFIG.resources.warm_start.threads
    resources:
        cpus_per_task=STUDY_CONFIG.resources.warm_start.threads,  # see rule train
        mem_mb=STUDY_CONFIG.resources.warm_start.mem_mb,
        runtime=STUDY_CONFIG.resources.warm_start.runtime,
        gpu=STUDY_CONFIG.resources.warm_start.gpu,
    params:
        allow=out_of_band_flag,
        trainer_version=TRAINER_VERSION,  # an environment or trainer change rebuilds the base policy too
    shell:
        "python -m trainer warm-start --config {input.config} --out {output} --no-progress {params.allow} "
        "--exit-with $PPID > {log} 2>&1"
