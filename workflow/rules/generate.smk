# One generation job per cell: resumable (samples go to a journal first), timed after a warm-up,
# with the cell's standard method run beside it when side_by_side is on. OpenMP threads wait
# passively: spinning threads on a machine with a competing process turned a 2-thread job 3.2x
# slower (1.35x when passive), and a pair caught in that was timed wrong.


rule generate:
    input:
        lambda w: [f"{RESULTS}/models/{m}.json" for m in cell_dims(w)["models"]],
    output:
        samples=f"{GEN}/{{cell}}.jsonl",
        meta=f"{GEN}/{{cell}}.meta.json",
    params:
        cell=lambda w: json.dumps(CELLS[w.cell]["cell"]),
        journal=lambda w: f"{RESULTS}/journal/{Path(w.cell).parent}",
    log:
        f"{RESULTS}/logs/generate/{{cell}}.log",
    threads: _checked["threads"]
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=120,
    shell:
        "OMP_WAIT_POLICY=PASSIVE {PY} -m pipeline.cli generate {params.cell:q} {output.samples:q} --journal-dir {params.journal:q}"
        " --threads {threads} --timing {TIMING:q} --no-speed > {log:q} 2>&1"
