# One generation job per cell: resumable (samples go to a journal first), timed after a warm-up,
# with the cell's standard method run beside it when side_by_side is on. OpenMP threads wait
# passively: spinning threads on a machine with a competing process turned a 2-thread job 3.2x
# slower (1.35x when passive), and a pair caught in that was timed wrong. The timing settings come
# from timing.json as an ancient() input: a changed setting re-judges cells (the speed rule) and
# never regenerates a sample.


rule generate:
    input:
        models=lambda w: [f"{RESULTS}/models/{m}.json" for m in cell_dims(w).models],
        cell=CELL_FILE,
        timing=ancient(f"{RESULTS}/timing.json"),
    output:
        samples=CELL("samples"),
        meta=CELL("meta"),
    log:
        f"{RESULTS}/logs/generate/{{cell}}.log",
    group:
        "cell"
    conda:
        env("decode")
    threads: generate_threads
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=120,
    params:
        journal=lambda w: f"{RESULTS}/journal/{Path(w.cell).parent}",
    shell:
        'OMP_WAIT_POLICY=PASSIVE "$PY" -m pipeline.cli generate {input.cell:q} {output.samples:q}'
        " --journal-dir {params.journal:q} --threads {threads} --timing-file {input.timing:q} --no-speed"
        " > {log:q} 2>&1"
