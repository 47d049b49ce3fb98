"""One vLLM engine in vLLM's own environment, serving a generation job over JSON lines (``engine.py`` starts it).

Run as a file by the environment's interpreter (``python worker.py '<settings>'``): it imports only the standard
library and vLLM, never the project (whose environment it does not share). The settings (one JSON argument) say
the model, the speculative configuration (none: vLLM's autoregressive decoding), the dtype and whether to run eager.
It answers on its standard output and nothing else: vLLM's own logging is sent to standard error.
With ``"expand_fix": true`` it corrects one shim of vLLM's CPU build before the engine starts (``expand_fix``: vLLM
issue #55005, the behaviour of its fix, PR #55006) and changes nothing else.

- First line out: ``{"ready": true, "versions": {...}, "load_s": ...}``, or ``{"error": "..."}`` and exit 1.
- Each line in: ``{"prompt_ids", "seed", "max_new_tokens", "temperature", "top_k", "top_p", "stop_ids",
  "stop_strings"}``; out: ``{"token_ids", "wall_s", "drafts", "draft_tokens", "accepted", "accepted_per_pos"}``,
  the last four the growth of vLLM's spec-decode counters over that request (0 without speculation).
"""

import json
import os
import sys
import time

sys.path.pop(0)  # this file's folder: none of its modules may shadow vLLM's dependencies

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}


def counters(llm) -> dict:
    """vLLM's spec-decode counters now (summed over engines)."""
    out = {name: 0 for name in SPEC_COUNTERS.values()}
    out["accepted_per_pos"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = [int(v) for v in metric.values]
            have = out["accepted_per_pos"]
            out["accepted_per_pos"] = [a + b for a, b in zip(values, have + [0] * (len(values) - len(have)))]
    return out


def grown(before: dict, after: dict) -> dict:
    out = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    prior = before["accepted_per_pos"] + [0] * len(after["accepted_per_pos"])
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], prior)]
    return out


def expand_at_callers_dtype(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """What vLLM's Triton ``expand_kernel`` computes, at the caller's dtype: request ``i``'s value (``replace_from``
    read as ``replace_to``) written to each of its tokens, ``cu_num_tokens`` the cumulative token counts. The CPU
    build's shim hands an int64 copy of ``output`` to its C++ kernel and drops it (and truncates float inputs)."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded)


def expand_fix() -> str:
    """Correct the CPU build's ``expand_kernel`` shim (vLLM issue #55005) before vLLM registers it for its
    rejection sampler, where the build has it; what was done, in words."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return "not needed: this build has no CPU shims"
    if not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return "not needed: this build has no expand_kernel shim"
    cpu_triton_utils._expand_kernel_impl = expand_at_callers_dtype
    return "applied: expand_kernel's CPU shim writes the caller's buffer at its dtype (vLLM #55005, PR #55006)"


def main() -> int:
    answer = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's channel
    os.dup2(2, 1)  # everything else printed (vLLM's logs, progress) goes to standard error
    settings = json.loads(sys.argv[1])
    try:
        import torch
        import transformers
        import vllm
        from vllm import LLM, SamplingParams

        fixed = expand_fix() if settings.get("expand_fix") else None
        start = time.perf_counter()
        llm = LLM(
            model=settings["model"],
            dtype=settings.get("dtype", "float32"),
            enforce_eager=settings.get("enforce_eager", True),
            max_model_len=settings.get("max_model_len", 4096),
            speculative_config=settings.get("speculative_config"),
            seed=settings.get("seed", 0),
            skip_tokenizer_init=settings.get("skip_tokenizer_init", False),  # ids in, ids out: no tokenizer needed
            disable_log_stats=False,  # the spec-decode counters
            **({"gpu_memory_utilization": settings["gpu_share"]} if settings.get("gpu_share") else {}),
        )
        load_s = time.perf_counter() - start
    except Exception as err:  # any failure to start is the job's one line
        first = (str(err).strip().splitlines() or [""])[0][:300]
        answer.write(json.dumps({"error": f"{type(err).__name__}: {first}"}) + "\n")
        return 1
    versions = {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
    if fixed is not None:
        versions["expand_fix"] = fixed
    answer.write(json.dumps({"ready": True, "versions": versions, "load_s": load_s}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        ask = json.loads(line)
        params = SamplingParams(
            n=1,
            temperature=ask["temperature"],
            top_k=ask["top_k"] or 0,  # 0: every token
            top_p=ask["top_p"],
            seed=ask["seed"],
            max_tokens=ask["max_new_tokens"],
            stop_token_ids=ask["stop_ids"],
            stop=ask["stop_strings"] or None,
            include_stop_str_in_output=True,
            detokenize=bool(ask["stop_strings"]),  # stop strings need text; the job decodes the ids itself
        )
        before = counters(llm)
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ask["prompt_ids"]}], params, use_tqdm=False)
        wall = time.perf_counter() - start
        reply = {"token_ids": list(out[0].outputs[0].token_ids), "wall_s": wall, **grown(before, counters(llm))}
        answer.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
