# Aggregation: speed-up and quality tables (CSV, Markdown, HTML), plots and results.json; then the analysis
# notebook. Outputs marked report() make `snakemake --report report.html` (captions: workflow/report/).


report: "../report/workflow.rst"


# a table's HTML page in the report, captioned by workflow/report/<name>.rst
table_report = lambda name, label: report(
    f"{RESULTS}/tables/{name}.html", caption=f"../report/{name}.rst", category="Tables", labels={"table": label}
)


rule aggregate:
    input:
        grid=f"{RESULTS}/grid.json",
        speed=[CELL("speed", c) for c in CELLS],
        summary=[CELL("summary", c) for c in CELLS],
        likelihood=[f"{RESULTS}/likelihood/{t}.json" for t in LIKELIHOOD],
        models=[f"{RESULTS}/models/{m}.json" for m in MODELS],  # the drafts table: how each was trained
    output:
        summary=f"{RESULTS}/tables/summary.md",
        cells=f"{RESULTS}/tables/cells.csv",
        speedup_csv=f"{RESULTS}/tables/speedup_vs_standard.csv",
        speedup_html=table_report("speedup_vs_standard", "speed-up over the standard method"),
        large_html=table_report("speedup_vs_large", "speed-up over the large model"),
        quality_html=table_report("quality", "quality"),
        likelihood_html=table_report("likelihood", "quality by log-likelihood"),
        acceptance_html=table_report("acceptance", "tau and acceptance"),
        flags_html=table_report("flags", "flags"),
        results=report(
            f"{RESULTS}/results.json",
            caption="../report/results_file.rst",
            category="Results file",
            labels={"file": "results.json"},
        ),
        plots=report(
            directory(f"{RESULTS}/plots"),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="Plots",
            labels={"plot": "{name}"},
        ),
    log:
        f"{RESULTS}/logs/aggregate.log",
    group:
        "report"
    conda:
        env("report")
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    params:
        results=lambda w, input: str(Path(input.grid).parent),
    shell:
        '$UNTIMED "$PY" -m pipeline.cli aggregate {params.results:q} > {log:q} 2>&1'


rule notebook:
    input:
        f"{RESULTS}/tables/cells.csv",
    output:
        f"{RESULTS}/analysis.ipynb",
    log:
        f"{RESULTS}/logs/notebook.log",
    group:
        "report"
    conda:
        env("report")
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    params:
        results=lambda w, input: str(Path(input[0]).parents[1]),
        notebook=str(ROOT / "notebooks" / "analysis.ipynb"),
    shell:
        '$UNTIMED "$PY" -m pipeline.cli notebook {params.notebook:q} {output:q} --results {params.results:q} > {log:q} 2>&1'
