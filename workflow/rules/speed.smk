# Judging a finished cell: speed-up with its interval, τ, interference and flags, exactness at T=0
# (.speed.json). Its own light job, so a changed `timing` setting re-judges every cell from its
# samples without generating any again; the float64 exactness recompute runs here, on a CPU, and
# only then does the job ask for the memory it needs (speed_mem_mb). A cell's generation, judging and
# scoring form the group `cell`: on a cluster, one submission.


rule timing:
    output:
        str(PATHS.timing),
    log:
        str(PATHS.log("timing")),
    localrule: True
    params:
        timing=TIMING,
    run:
        write_json(output[0], parse_json(params.timing, "timing"), log[0])


rule speed:
    input:
        samples=CELL("samples"),
        cell=CELL_FILE,
        timing=str(PATHS.timing),
        models=lambda w: [str(PATHS.model(m)) for m in cell_dims(w).models],
    output:
        CELL("speed"),
    log:
        str(PATHS.log("speed", "{cell}")),
    group:
        "cell"
    conda:
        env("decode")
    threads: 1
    resources:
        mem_mb=speed_mem_mb,
        runtime=30,
    shell:
        '$UNTIMED "$PY" -m pipeline.cli speed {input.cell:q} {input.samples:q} --timing-file {input.timing:q} > {log:q} 2>&1'
