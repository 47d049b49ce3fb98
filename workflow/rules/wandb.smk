# Weights & Biases: one run per cell (config: the cell's dimensions; summary: speed, acceptance,
# quality; a table of samples). A W&B failure never touches results/ (the source of truth): it is
# recorded in <cell>.wandb.failed.json (an online run is logged offline in its place), this job
# fails after at most wandb.init_timeout seconds, and the next workflow run retries it.


rule wandb_log:
    input:
        samples=f"{GEN}/{{cell}}.jsonl",
        cell=CELL_FILE,
        speed=f"{GEN}/{{cell}}.speed.json",
        summary=f"{GEN}/{{cell}}.summary.json",
        scores=f"{GEN}/{{cell}}.scores.jsonl",
    output:
        f"{GEN}/{{cell}}.wandb.json",
    params:
        experiment=_checked["experiment"],
        project=WANDB["project"],
        entity=f"--entity {shlex.quote(WANDB['entity'])}" if WANDB.get("entity") else "",
        mode=WANDB["mode"],
        timeout=WANDB["init_timeout"],
        results=lambda w, output: str(Path(output[0]).parents[len(Path(w.cell).parts)]),  # results/
    log:
        f"{RESULTS}/logs/wandb/{{cell}}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        env("wandb")
    shell:
        '"$PY" -m pipeline.cli wandb-log {input.samples:q} {output:q} --cell-file {input.cell:q}'
        " --experiment {params.experiment:q} --project {params.project:q} {params.entity} --mode {params.mode}"
        " --dir {params.results:q} --init-timeout {params.timeout} > {log:q} 2>&1"
