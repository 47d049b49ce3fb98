# Aggregation: speed-up and quality tables (CSV + Markdown) and plots; then the analysis notebook.


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
    params:
        results=lambda w, input: str(Path(input.grid).parent),
    group:
        "report"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    conda:
        env("report")
    shell:
        '"$PY" -m pipeline.cli aggregate {params.results:q} > {log:q} 2>&1'


rule notebook:
    input:
        f"{RESULTS}/tables/cells.csv",
    output:
        f"{RESULTS}/analysis.ipynb",
    params:
        results=lambda w, input: str(Path(input[0]).parents[1]),
        notebook=str(ROOT / "notebooks" / "analysis.ipynb"),
    log:
        f"{RESULTS}/logs/notebook.log",
    group:
        "report"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    conda:
        env("report")
    shell:
        '"$PY" -m pipeline.cli notebook {params.notebook:q} {output:q}'
        " --results {params.results:q} > {log:q} 2>&1"
