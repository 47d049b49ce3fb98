"""vLLM beside our decoder (docs/vllm.md): its environment (``env.py``), a worker process in it (``worker.py``),
the generation job's side of it (``engine.py``) and the feature head its EAGLE runs (``eagle.py``); its greedy
tokens against ours: ``report/agreement.py``. vLLM is a peer: it cannot ensemble, so its methods (``vllm``,
``vllm_sd``, ``vllm_ngram``, ``vllm_eagle``, ``vllm_eagle3``) are measured against its own autoregressive decoding,
as ours are against ours."""
