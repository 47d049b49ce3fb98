#!/usr/bin/env bash
# The GPU measurements, in one call of about 15 minutes (see README: Engines and devices).
# Prepare here first (CPU): python benchmarks/gpu/product_path.py --prepare .gpu-carry
# Then on the GPU machine, from the repository root, with .gpu-carry carried:  bash benchmarks/gpu/run.sh
# Everything is written under $OUT (default /tmp/gpu-out) and printed.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
PY=${PY:-python}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
# 1. tokens/s, the bandwidth bound and the cost of k new tokens, per size and engine; oracle drafts vs the cost model
timeout 420 $PY -m pipeline.engine_bench --device cuda --shapes llama-68m llama-1b llama-7b --dtype bfloat16 \
  --engines eager compiled --repeats 5 --new-tokens 64 --pairs llama-7b:llama-68m llama-1b:llama-68m \
  --accept 0.5 0.8 0.95 --gamma 3 \
  --json "$OUT/engines.json" 2>&1 | tee "$OUT/engines.txt"
# 2. the product path: generation jobs on grid cells, side by side, with exactness
timeout 300 $PY benchmarks/gpu/product_path.py --carry .gpu-carry --out "$OUT/product" --device cuda \
  2>&1 | grep -v "^ *[0-9]*%|" | tee "$OUT/product.txt"
# 3. the tests that need a GPU
timeout 120 $PY -m pytest tests/test_static_runner.py -q -m gpu -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/tests.txt"
