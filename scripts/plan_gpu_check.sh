#!/usr/bin/env bash
# The memory plan against CUDA peaks at the paper's model sizes (random weights of the published
# shapes; nothing downloaded), on a CUDA machine with torch and transformers; from the repository
# root:  bash scripts/plan_gpu_check.sh OUT.jsonl
# AdamW steps at batch 4 x 128 tokens in mixed precision and in bfloat16 (and gpt2-xl with
# gradient checkpointing), and a plain bfloat16 forward with one donor held, per shape.
set -euo pipefail
out=${1:?usage: bash scripts/plan_gpu_check.sh OUT.jsonl}
py=${PYTHON:-python3}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
check() { "$py" -m benchmarks.plan_check "$@" --device cuda --json "$out"; }
for shape in gpt2-xl pythia-2.8b llama3.2-1b gemma-1.1-2b; do
    for precision in mixed bfloat16; do
        check train --model "$shape" --precision "$precision" --batch-size 4 --seq-len 128 --steps 3
    done
done
for precision in mixed bfloat16; do
    check train --model gpt2-xl --precision "$precision" --batch-size 4 --seq-len 128 --steps 3 \
        --gradient-checkpointing
done
for shape in gpt2-xl pythia-2.8b llama3.2-1b gemma-1.1-2b; do
    check forward --model "$shape" --dtype bfloat16 --batch-size 32 --seq-len 24
done
