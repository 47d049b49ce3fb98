# Aggregation: speed-up and quality tables (CSV + Markdown) and plots; then the analysis notebook.


rule grid:
    output:
        f"{RESULTS}/grid.json",
    params:
        grid=json.dumps([c["dims"] for c in CELLS.values()]),
    localrule: True
    run:
        from pipeline.files import write_atomic

        write_atomic(Path(output[0]), json.dumps(json.loads(params.grid), indent=1) + "\n")


rule aggregate:
    input:
        grid=f"{RESULTS}/grid.json",
        speed=[f"{GEN}/{c}.speed.json" for c in CELLS],
        summary=[f"{GEN}/{c}.summary.json" for c in CELLS],
    output:
        summary=f"{RESULTS}/tables/summary.md",
        cells=f"{RESULTS}/tables/cells.csv",
    log:
        f"{RESULTS}/logs/aggregate.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    shell:
        "{PY} -m pipeline.cli aggregate {RESULTS:q} > {log:q} 2>&1"


rule notebook:
    input:
        f"{RESULTS}/tables/cells.csv",
    output:
        f"{RESULTS}/analysis.ipynb",
    params:
        notebook=str(ROOT / "notebooks" / "analysis.ipynb"),
    log:
        f"{RESULTS}/logs/notebook.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    shell:
        "{PY} -m pipeline.cli notebook {params.notebook:q} {output:q} --results {RESULTS:q} > {log:q} 2>&1"
