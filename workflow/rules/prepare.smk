# Model preparation: convert, download or distil each model once, before any job uses it.


rule prepare_model:
    output:
        f"{RESULTS}/models/{{model}}.json",
    params:
        spec=lambda w: json.dumps(model_entry(_checked, w.model)),
    log:
        f"{RESULTS}/logs/prepare/{{model}}.log",
    threads: max(_checked["threads"], 2)  # distillation is time-capped: it gets at least two threads
    resources:
        mem_mb=16000,
        runtime=60,
    conda:
        env("decode")
    shell:
        '"$PY" -m pipeline.cli prepare {params.spec:q} {output:q} --threads {threads} > {log:q} 2>&1'
