#!/usr/bin/env bash
# The GPU checks of graft at the paper's sizes, on a CUDA machine where graft's dependencies
# are installed (TORCH_SPEC="torch==2.13.0" bash scripts/setup.sh, or any Python with torch,
# transformers 5.x and nnsight 0.8 on the path); run from the repository root:
#
#     bash scripts/gpu_checks.sh OUT_DIR [TOKENIZER_DIR]
#
# 1. benchmarks.paper_scale: the engine on random-weight models of the four paper models'
#    exact shapes, float32 and bfloat16, batch 32 and 128, against a plain batched forward
#    (E1 and E3 ratios, rows/s, CUDA max allocated, and the paper's routine on 2 FE+LT
#    examples; goals E1 <= 1.2, E3 <= 0.5 on a GPU), and the host-bound proxy (--width 64);
#    expected: each table printed with its ratios, a FAIL mark where a goal is missed;
# 2. benchmarks.finetune_memory: peak memory and step time of AdamW finetuning steps on the
#    paper shapes (batch 4, the paper's; 128 tokens): mixed precision on all four, bfloat16
#    on gpt2-xl and pythia-2.8b, and gpt2-xl with gradient checkpointing.
# 3. the fast tier of the test suite on the GPU (pytest --graft-device cuda: every test's
#    models and tensors on cuda, float32 without TF32, the tests' own tolerances); its output
#    in OUT_DIR/pytest_cuda.txt. Never run yet: no GPU was lent since it was written.
# Every result is written as JSON into OUT_DIR and printed.
set -euo pipefail
out=${1:?usage: bash scripts/gpu_checks.sh OUT_DIR [TOKENIZER_DIR]}
tok=${2:-}
py=${PYTHON:-python3}
mkdir -p "$out"
tok_args=()
[ -n "$tok" ] && tok_args=(--tokenizer "$tok")
"$py" -c 'import torch, transformers, nnsight, graft.core.execution.engine, benchmarks.paper_scale
assert torch.cuda.is_available(), "no CUDA device"
print(torch.cuda.get_device_name(0), torch.__version__, transformers.__version__, nnsight.__version__)'
"$py" -m benchmarks.paper_scale --device cuda --prompts 32 --batch-size 32 --repeats 3 \
    --paper-examples 2 "${tok_args[@]}" --json "$out/paper_scale_cuda.json"
"$py" -m benchmarks.paper_scale --device cuda --prompts 128 --batch-size 128 --repeats 3 \
    "${tok_args[@]}" --json "$out/paper_scale_cuda_b128.json"
# the host-bound proxy on the GPU too: how far its CPU goals carry over
"$py" -m benchmarks.paper_scale --device cuda --shapes gpt2-xl:48,llama3.2-1b:16 --width 64 \
    --dtypes float32 --prompts 32 --batch-size 32 --repeats 5 "${tok_args[@]}" \
    --json "$out/host_proxy_cuda.json"
# the fast tier of the suite on the GPU (float32, TF32 off, the tests' own tolerances)
"$py" -m pytest -q -m "not slow" -p no:cacheprovider --graft-device cuda \
    > "$out/pytest_cuda.txt" 2>&1 || echo "pytest on cuda failed: see $out/pytest_cuda.txt"
tail -n 3 "$out/pytest_cuda.txt"
run_finetune() {  # shape precision [extra flags]
    local shape=$1 precision=$2
    shift 2
    "$py" -m benchmarks.finetune_memory --device cuda --shape "$shape" --precision "$precision" \
        --batch-size 4 --seq-len 128 --steps 5 "$@" --json "$out/finetune_${shape}_${precision}$*.json"
}
for shape in gpt2-xl llama3.2-1b pythia-2.8b gemma-1.1-2b; do
    run_finetune "$shape" mixed
done
run_finetune gpt2-xl bfloat16
run_finetune pythia-2.8b bfloat16
run_finetune gpt2-xl mixed --gradient-checkpointing
