#!/usr/bin/env bash
# The GPU measurements, in three calls of under 10 minutes each (see docs/cluster.md: The H100 figures).
# Prepare here first (CPU): python benchmarks/gpu/product_path.py --prepare .gpu-carry
# trees and trees-compiled run the bundled model: it travels in two calls (benchmarks/gpu/bundled.sh says how)
# Then on the GPU machine, from the repository root, with .gpu-carry carried:
#   bash benchmarks/gpu/run.sh tests     # the GPU tests (~3 min on an H100)
#   bash benchmarks/gpu/run.sh product   # generation jobs per runner, side by side, with exactness (~8 min)
#     RUNNERS="compiled eager" picks the runners and their order (default: eager compiled eager+auto)
#   bash benchmarks/gpu/run.sh speed     # what a forward costs per runner and size, oracle drafts (~8 min)
#   bash benchmarks/gpu/run.sh trees     # token trees against chains of the same node budget (~4 min at 6 prompts)
#   bash benchmarks/gpu/run.sh trees-compiled  # sd's chain and tree on the compiled runner (CUDA graphs)
#   bash benchmarks/gpu/run.sh heads     # the feature-head proposer (eagle) beside lookup+draft and the draft, T=0 and 1
#                                        # FEATURE_HEAD: a trained head carried (bundled.sh prepare with HEAD=...)
#   bash benchmarks/gpu/run.sh vllm      # vLLM beside ours (benchmarks/gpu/vllm.yaml): only where vLLM's GPU build can
#                                        # be installed (a registry in reach; not this project's GPU sessions)
#   bash benchmarks/gpu/run.sh           # all but vllm (~35 min: too long for one call)
# Results of the last GPU session: benchmarks/gpu/results/.
# Everything is written under $OUT (default /tmp/gpu-out, at most 8 files) and printed.
set -uo pipefail
PART=${1:-all}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
part() { [ "$PART" = all ] && [ "$1" != vllm ] || [ "$PART" = "$1" ]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee -a "$OUT/gpu.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
if part tests; then
  # 1. the tests that need a GPU: the real compiled runners and the members' streams against the eager runner
  timeout 220 $PY -m pytest tests/test_gpu.py tests/test_static_runner.py -m gpu -q -p no:cacheprovider 2>&1 \
    | tail -25 | tee "$OUT/tests.txt"
fi
if part product; then
  # 2. the product path: generation jobs on grid cells per runner (eager, compiled, eager on device_map=auto), in float32,
  #    side by side with the standard method, with exactness (models written outside $OUT)
  timeout ${PRODUCT_TIMEOUT:-560} $PY benchmarks/gpu/product_path.py --carry .gpu-carry --out /tmp/product --device cuda \
    --dtype float32 --runners ${RUNNERS:-eager compiled eager+auto} 2>&1 | grep -v "^ *[0-9]*%|" | tee "$OUT/product.txt"
  cp /tmp/product/product_path.json "$OUT/" 2>/dev/null
fi
if part speed; then
  # 3. tokens/s, the bandwidth bound and the cost of k new tokens, per size and runner, in bfloat16
  timeout 400 $PY -m pipeline.bench.runners --device cuda --shapes llama-68m llama-1b llama-7b --dtype bfloat16 \
    --runners eager compiled --repeats 5 --new-tokens 64 \
    --json "$OUT/runners.json" 2>&1 | grep -v "it/s\]" | tee "$OUT/runners.txt"
  # 4. oracle drafts against the cost model, in float32 (in bfloat16 sd's greedy tokens drift from the target's)
  timeout 170 $PY -m pipeline.bench.runners --device cuda --shapes llama-68m llama-1b --dtype float32 \
    --runners eager --repeats 3 --new-tokens 64 --ks 1 4 --pairs llama-1b:llama-68m --accept 0.5 0.8 0.95 --gamma 3 \
    --json "$OUT/pairs.json" 2>&1 | grep -v "it/s\]" | tee "$OUT/pairs.txt"
fi
if part trees; then
  # 5. token trees (docs/trees.md) against chains of the same node budget on the bundled pair: sd over large_model,
  #    we_se over we, τ per target forward, and the cost model's best budget at the GPU's measured forward costs
  #    (the distilled draft is made on first use, cached under the model cache)
  #    (TREES_PROMPTS, TREES_TIMEOUT: fewer prompts where the draft is made in the same call)
  timeout 200 $PY -c "import time; t = time.perf_counter()
from pipeline.models.resolve import ensure_draft; from pipeline.models.distill import Recipe
from pipeline.models.spec import BUNDLED
print('draft', ensure_draft(BUNDLED, Recipe(layers=2)), f'ready in {time.perf_counter() - t:.0f} s')" 2>&1 \
    | grep -v "it/s\]" | tail -4 | tee "$OUT/draft.txt"
  timeout ${TREES_TIMEOUT:-560} $PY -m pipeline.bench --device cuda --groups sd we --methods sd we_se --gamma 1 3 \
    --dynamic --tree 3x2x1 d16 --sd-temperature 1 --prompts ${TREES_PROMPTS:-10} --max-new-tokens 128 \
    --record /tmp/trees-record \
    --json "$OUT/trees.json" 2>&1 | grep -v "it/s\]" | tee "$OUT/trees.txt"
fi
if part trees-compiled; then
  # 6. sd's chain and tree on the compiled runner (CUDA graphs; a tree's masked forwards in buckets up to its node
  #    count), compiled before the timed runs. Sized to one call: 3 prompts x 64 tokens need one cache size (every
  #    cache size compiles its own graphs), sd alone (the we group doubles the models); 2026-11-27, H200: the
  #    we group too, 4 prompts x 128 tokens, two cache sizes had printed nothing after 430 s (compiling)
  timeout ${TREES_TIMEOUT:-560} $PY -m pipeline.bench --device cuda --runner compiled --groups ${TREES_GROUPS:-sd} \
    --methods sd we_se --gamma 3 --dynamic --tree 3x2x1 --prompts ${TREES_PROMPTS:-3} --max-new-tokens 64 \
    --record /tmp/trees-record \
    --json "$OUT/trees-compiled.json" 2>&1 | grep -v "it/s\]" | tee "$OUT/trees-compiled.txt"
fi
if part heads; then
  # 7. the feature-head proposer (docs/proposers.md) on the product's decoder, beside lookup+draft and the distilled
  #    draft alone, at T=0 and T=1: τ, acceptance, and the head's cost per drafted token over one target forward
  #    (prop. cost). The eager runner: the head reads the target's features through hooks on its forwards, and
  #    the proposer refuses the compiled runner (docs/proposers.md, "On a GPU"; 2026-11-28, H200: 5.5 min for both). FEATURE_HEAD: a trained head's directory
  #    (default: the bundled model's own, trained on first use)
  for t in 0 1; do
    timeout ${HEADS_TIMEOUT:-240} $PY -m pipeline.bench --device cuda --groups sd --methods sd --gamma 3 --dynamic 1 \
      --proposer eagle lookup+draft draft --sd-temperature $t --prompts ${HEADS_PROMPTS:-6} --max-new-tokens 128 \
      ${FEATURE_HEAD:+--feature-head "$FEATURE_HEAD"} --record /tmp/heads-record --json "$OUT/heads-t$t.json" 2>&1 \
      | grep -v "it/s\]" | tee "$OUT/heads-t$t.txt"
  done
fi
if part vllm; then
  # 8. vLLM beside ours (docs/vllm.md): its GPU build in an environment of its own (built once, pinned version), then
  #    the engines grid: our large_model and sd, vLLM's decoding, prompt lookup and draft-model speculation
  SPECENS_VLLM_BUILD=gpu $PY -m pipeline.vllm.env --out "$OUT/vllm-env.json" 2>&1 | tail -3 | tee "$OUT/vllm.txt"
  SPECENS_VLLM_BUILD=gpu timeout ${VLLM_TIMEOUT:-1800} $PY -m snakemake --cores 2 --configfile benchmarks/gpu/vllm.yaml \
    2>&1 | tail -5 | tee -a "$OUT/vllm.txt"
  cat results-vllm-gpu/tables/ours_vs_vllm.md results-vllm-gpu/tables/ours_vs_peers.md 2>&1 | tee -a "$OUT/vllm.txt"
fi
