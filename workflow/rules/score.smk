# Scoring: its own job per cell (HumanEval runs in the sandbox), after the cell's generation (on a
# cluster in the same SLURM job: group `cell`). It declares the CPUs its sandbox workers use, so it never
# runs beside a generation job that is being timed (seen: scoring beside generation put 0.1 s/s of CPU
# pressure on every pair it overlapped).


rule score:
    input:
        samples=CELL("samples"),
    output:
        scores=CELL("scores"),
        summary=CELL("summary"),
    log:
        str(PATHS.log("score", "{cell}")),
    group:
        "cell"
    conda:
        env("score")
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        task=lambda w: cell_dims(w).dataset,
        data_dir=f"--data-dir {shlex.quote(_checked['data_dir'])}" if _checked["data_dir"] else "",
    shell:
        '$UNTIMED "$PY" -m pipeline.cli score {input.samples:q} --task {params.task} {params.data_dir} --workers {threads}'
        " > {log:q} 2>&1"
