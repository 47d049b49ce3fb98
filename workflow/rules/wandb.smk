# Weights & Biases: one run per cell (config: the cell's dimensions; summary: speed, acceptance,
# quality; a table of samples). A W&B failure is recorded in the status file, never fatal:
# the files under results/ are the source of truth.


rule wandb_log:
    input:
        samples=f"{GEN}/{{cell}}.jsonl",
        speed=f"{GEN}/{{cell}}.speed.json",
        summary=f"{GEN}/{{cell}}.summary.json",
        scores=f"{GEN}/{{cell}}.scores.jsonl",
    output:
        f"{GEN}/{{cell}}.wandb.json",
    params:
        dims=lambda w: json.dumps(cell_dims(w)),
        cell=lambda w: json.dumps(CELLS[w.cell]["cell"]),
        experiment=_checked["experiment"],
        project=WANDB["project"],
        entity=f"--entity {shlex.quote(WANDB['entity'])}" if WANDB.get("entity") else "",
        mode=WANDB["mode"],
    log:
        f"{RESULTS}/logs/wandb/{{cell}}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{PY} -m pipeline.cli wandb-log {input.samples:q} {output:q} --dims {params.dims:q} --cell {params.cell:q}"
        " --experiment {params.experiment:q} --project {params.project:q} {params.entity} --mode {params.mode}"
        " --dir {RESULTS:q} > {log:q} 2>&1"
