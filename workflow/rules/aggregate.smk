# Aggregation: speed-up and quality tables (CSV, Markdown, HTML), plots and results.json; then the analysis
# notebook. Outputs marked report() make `snakemake --report report.html` (captions: workflow/report/).


report: "../report/workflow.rst"


# a table's HTML page in the report, captioned by workflow/report/<name>.rst
table_report = lambda name, label: report(
    str(PATHS.table(name, "html")), caption=f"../report/{name}.rst", category="Tables", labels={"table": label}
)


rule aggregate:
    input:
        grid=str(PATHS.grid),
        speed=[CELL("speed", c) for c in CELLS],
        summary=[CELL("summary", c) for c in CELLS],
        likelihood=[str(PATHS.likelihood(t)) for t in LIKELIHOOD],
        models=[str(PATHS.model(m)) for m in MODELS],  # the drafts table: how each was trained
    output:
        summary=str(PATHS.summary),
        cells=str(PATHS.cells_table),
        speedup_csv=str(PATHS.table("speedup_vs_standard", "csv")),
        speedup_html=table_report("speedup_vs_standard", "speed-up over the standard method"),
        large_html=table_report("speedup_vs_large", "speed-up over the large model"),
        quality_html=table_report("quality", "quality"),
        likelihood_html=table_report("likelihood", "quality by log-likelihood"),
        acceptance_html=table_report("acceptance", "tau and acceptance"),
        flags_html=table_report("flags", "flags"),
        results=report(
            str(PATHS.results_file),
            caption="../report/results_file.rst",
            category="Results file",
            labels={"file": "results.json"},
        ),
        plots=report(
            directory(str(PATHS.plots)),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="Plots",
            labels={"plot": "{name}"},
        ),
    log:
        str(PATHS.log("aggregate")),
    group:
        "report"
    conda:
        env("report")
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    params:
        results=lambda w, input: PATHS.root_of(input.grid, PATHS.grid),
    shell:
        '$UNTIMED "$PY" -m pipeline.cli aggregate {params.results:q} > {log:q} 2>&1'


rule notebook:
    input:
        str(PATHS.cells_table),
    output:
        str(PATHS.notebook),
    log:
        str(PATHS.log("notebook")),
    group:
        "report"
    conda:
        env("report")
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    params:
        results=lambda w, input: PATHS.root_of(input[0], PATHS.cells_table),
        notebook=str(ROOT / "notebooks" / "analysis.ipynb"),
    shell:
        '$UNTIMED "$PY" -m pipeline.cli notebook {params.notebook:q} {output:q} --results {params.results:q} > {log:q} 2>&1'
