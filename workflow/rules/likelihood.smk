# Quality by log-likelihood (likelihood_tasks): one job per lm-eval task, scoring it once under each distinct
# distribution of the grids (a lossless accelerated method shares its ensemble's; pipeline/job/likelihood.py).
# Its spec is a param, so a change of the grid's distributions or the task's limit reruns it. It declares two
# CPUs (their threads waiting passively, as generate's), so that it never runs beside a generation job being timed.


rule likelihood:
    input:
        models=lambda w: [str(PATHS.model(m)) for m in LIKELIHOOD[w.task]["models"]],
    output:
        str(PATHS.likelihood("{task}")),
    log:
        str(PATHS.log("likelihood", "{task}")),
    conda:
        env("decode")
    threads: 2
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=120,
    params:
        spec=lambda w: json.dumps(LIKELIHOOD[w.task], sort_keys=True),
    shell:
        'OMP_WAIT_POLICY=PASSIVE $UNTIMED "$PY" -m pipeline.cli likelihood {params.spec:q} {output:q} --threads {threads}'
        " > {log:q} 2>&1"
