#!/usr/bin/env bash
# `longctx extend` on the GPUs of one machine: FSDP2 full sharding, bf16, one process per GPU.
# The paper's stage: RoPE base 10k -> 1M, 32k-token sequences, 80B tokens, 4M tokens per step.
#
#   bash scripts/extend_torchrun.sh CKPT OUT DATA [more longctx extend options]
#
# Interrupted? Run the same command again: --resume continues from the newest state in OUT.train/
# (and starts from scratch when there is none yet), so the line is safe to repeat.
set -euo pipefail
CKPT=$1 OUT=$2 DATA=$3
shift 3
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}

torchrun --standalone --nproc_per_node "$NPROC" -m longctx extend "$CKPT" \
    --rope-base 1e6 --seq-len 32k --tokens 80B --tokens-per-step 4M \
    --data "$DATA" --save-every 500 --resume -o "$OUT" "$@"
# Same run through accelerate (it wraps torchrun):
#   accelerate launch --num_processes "$NPROC" -m longctx extend "$CKPT" --rope-base 1e6 ... -o "$OUT"
