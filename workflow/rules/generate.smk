# One generation job per cell: resumable (samples go to a journal first), timed after a warm-up,
# with the cell's standard method run beside it when side_by_side is on.


rule generate:
    input:
        lambda w: [f"{RESULTS}/models/{m}.json" for m in cell_dims(w)["models"]],
    output:
        samples=f"{GEN}/{{cell}}.jsonl",
        speed=f"{GEN}/{{cell}}.speed.json",
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
        "{PY} -m pipeline.cli generate {params.cell:q} {output.samples:q} --journal-dir {params.journal:q}"
        " --threads {threads} > {log:q} 2>&1"
