# Model preparation: each hub model is downloaded once by fetch_model, a local rule (it runs where
# Snakemake runs, where the network is: compute nodes often have none); prepare_model then converts
# or distils the model and loads it once to check it, on a compute node, with the hub offline.


rule fetch_model:
    output:
        str(PATHS.fetched("{model}")),
    log:
        str(PATHS.log("prepare", "{model}.fetch")),
    localrule: True
    conda:
        env("decode")
    params:
        repo=lambda w: HUB_MODELS[w.model],
    shell:
        '$UNTIMED "$PY" -c "import sys; from pipeline.models.sources import hub_dir; print(hub_dir(sys.argv[1]))"'
        " {params.repo:q} > {output:q} 2> {log:q}"


rule prepare_model:
    input:
        lambda w: [str(PATHS.fetched(w.model))] if w.model in HUB_MODELS else [],
    output:
        str(PATHS.model("{model}")),
    log:
        str(PATHS.log("prepare", "{model}")),
    priority: 2  # before a one-core job (vllm_env) that would leave it waiting for the second core
    conda:
        env("decode")
    threads: max(_checked["threads"], 2)  # a distillation trains with two threads (the same weights everywhere)
    resources:
        mem_mb=16000,
        runtime=60,
    params:
        spec=lambda w: json.dumps(model_entry(_checked, w.model)),
        offline=lambda w: "HF_HUB_OFFLINE=1 " if w.model in HUB_MODELS else "",
    shell:
        '{params.offline}$UNTIMED "$PY" -m pipeline.cli prepare {params.spec:q} {output:q} --threads {threads} > {log:q} 2>&1'


# vLLM's own environment (pipeline/vllm/env.py: a virtual environment from the pinned lock in workflow/envs/), built
# once per machine into the model cache where Snakemake runs (on a cluster: the login node, where the registry is),
# for the generation jobs of vLLM's cells (methods vllm, vllm_sd, vllm_ngram, vllm_eagle). Its record names the interpreter.
rule vllm_env:
    output:
        str(PATHS.environment(ENGINES["vllm"].environment)),
    log:
        str(PATHS.log("prepare", "vllm_env")),
    priority: 1  # right after the models: beside the first generation jobs, not after the last of them
    localrule: True
    conda:
        env("decode")
    shell:
        '$UNTIMED "$PY" -m pipeline.vllm.env --out {output:q} > {log:q} 2>&1'
