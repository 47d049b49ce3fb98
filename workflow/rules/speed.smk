# Judging a finished cell: speed-up with its interval, τ, interference and flags, exactness at T=0
# (.speed.json). Its own light job, so a changed `timing` setting re-judges every cell from its
# samples without generating any again; the float64 exactness recompute runs here, on a CPU.


rule speed:
    input:
        samples=f"{GEN}/{{cell}}.jsonl",
    output:
        f"{GEN}/{{cell}}.speed.json",
    params:
        cell=lambda w: json.dumps(CELLS[w.cell]["cell"]),
        timing=TIMING,
    log:
        f"{RESULTS}/logs/speed/{{cell}}.log",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=30,
    shell:
        "{PY} -m pipeline.cli speed {params.cell:q} {input.samples:q} --timing {params.timing:q} > {log:q} 2>&1"
