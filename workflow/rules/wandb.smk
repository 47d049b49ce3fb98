# Weights & Biases: one run per cell (job_type "cell"; config: the cell's dimensions and method;
# summary: speed, acceptance, quality; a table of samples), and one run per experiment (job_type
# "aggregate") with the aggregate tables. Run ids come from the experiment and the cell: a rerun
# resumes the same run. Local rules: they run where Snakemake runs, where the network is. A W&B
# failure never touches results/ (the source of truth): it is recorded in <cell>.wandb.failed.json
# (an online run is logged offline in its place), the job fails after at most wandb.init_timeout
# seconds, and the next workflow run retries it.

WANDB_ARGS = (
    f"--experiment {shlex.quote(_checked['experiment'])} --project {shlex.quote(WANDB['project'])}"
    + (f" --entity {shlex.quote(WANDB['entity'])}" if WANDB.get("entity") else "")
    + f" --mode {WANDB['mode']} --init-timeout {WANDB['init_timeout']}"
)


rule wandb_log:
    input:
        samples=CELL("samples"),
        cell=CELL_FILE,
        speed=CELL("speed"),
        summary=CELL("summary"),
        scores=CELL("scores"),
    output:
        CELL("wandb"),
    log:
        str(PATHS.log("wandb", "{cell}")),
    localrule: True
    conda:
        env("wandb")
    params:
        settings=WANDB_ARGS,
        results=lambda w, output: PATHS.root_of(output[0], PATHS.cell(w.cell, "wandb")),
    shell:
        '$UNTIMED "$PY" -m pipeline.cli wandb-log {input.samples:q} {output:q} --cell-file {input.cell:q} {params.settings}'
        " --dir {params.results:q} > {log:q} 2>&1"


rule wandb_experiment:
    input:
        cells=[CELL("wandb", c) for c in CELLS],
        table=str(PATHS.cells_table),
        summary=str(PATHS.summary),
    output:
        str(PATHS.wandb),
    log:
        str(PATHS.log("wandb", "experiment")),
    localrule: True
    conda:
        env("wandb")
    params:
        settings=WANDB_ARGS,
        results=lambda w, input: PATHS.root_of(input.table, PATHS.cells_table),
    shell:
        '$UNTIMED "$PY" -m pipeline.cli wandb-log-experiment {params.results:q} {output:q} {params.settings}'
        " > {log:q} 2>&1"
