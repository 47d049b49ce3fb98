# One generation job per cell: resumable (samples go to a journal first), timed after a warm-up,
# with the cell's standard method run beside it when side_by_side is on. OpenMP threads wait
# passively: spinning threads on a machine with a competing process turned a 2-thread job 3.2x
# slower (1.35x when passive), and a pair caught in that was timed wrong. The timing settings come
# from timing.json as an ancient() input: a changed setting re-judges cells (the speed rule) and
# never regenerates a sample.


rule generate:
    input:
        models=lambda w: [str(PATHS.model(m)) for m in cell_dims(w).models],
        cell=CELL_FILE,
        timing=ancient(str(PATHS.timing)),
        environment=lambda w: (
            [ancient(str(PATHS.environment(ENGINE_CELLS[w.cell].environment)))] if w.cell in ENGINE_CELLS else []
        ),
    output:
        samples=CELL("samples"),
        meta=CELL("meta"),
    log:
        str(PATHS.log("generate", "{cell}")),
    wildcard_constraints:
        cell=cells_regex(c for c in CELLS if c not in DERIVED),
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
        journal=lambda w: str(PATHS.journal(str(Path(w.cell).parent))),
    shell:
        'OMP_WAIT_POLICY=PASSIVE "$PY" -m pipeline.cli generate {input.cell:q} {output.samples:q}'
        " --journal-dir {params.journal:q} --threads {threads} --timing-file {input.timing:q} --no-speed"
        " > {log:q} 2>&1"


# A standard method's cell whose runs another cell makes beside its own samples (side_by_side: the same models,
# prompts, seeds and sampling) takes its samples from there instead of generating them again
# (pipeline/job/derive.py; docs/workflow.md, "Cells and rules"). A file transform in its source's group job: on a
# cluster the two cells are one submission, and the derived cell asks for no GPU of its own.
rule derive:
    input:
        source=lambda w: CELL("samples", DERIVED[w.cell]),
        meta=lambda w: CELL("meta", DERIVED[w.cell]),
        cell=CELL_FILE,
    output:
        samples=CELL("samples"),
        meta=CELL("meta"),
    log:
        str(PATHS.log("derive", "{cell}")),
    wildcard_constraints:
        cell=cells_regex(DERIVED),
    group:
        "cell"
    conda:
        env("decode")
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        '$UNTIMED "$PY" -m pipeline.cli derive {input.cell:q} {input.source:q} {output.samples:q} > {log:q} 2>&1'
