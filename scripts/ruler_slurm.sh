#!/usr/bin/env bash
# RULER across a Slurm cluster: an array of N jobs, each predicting one shard of the run on one GPU
# (`longctx ruler run ... --shard I/N`), then one job, started when every shard has succeeded, that puts them
# together and scores the run (`longctx ruler merge`). RUN_DIR must be on a filesystem every node sees.
#
#   bash scripts/ruler_slurm.sh CKPT RUN_DIR N [longctx ruler options, e.g. --lengths 4k,8k,16k,32k,64k,128k --data-dir DATA]
#
# A shard that failed or was preempted: submit the same line again. Every shard resumes (a finished one predicts
# nothing and ends at once), and the merge runs when all are done. Extra sbatch options: SBATCH_SHARD_OPTIONS and
# SBATCH_MERGE_OPTIONS (e.g. "--partition=gpu --account=me"); GPUS_PER_SHARD (default 1) for a model that needs
# tensor parallelism (add --tensor-parallel-size to the options).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash scripts/ruler_slurm.sh CKPT RUN_DIR N [longctx ruler options]" >&2
    exit 2
fi
CKPT=$1 RUN_DIR=$2 N=$3
shift 3
GPUS_PER_SHARD=${GPUS_PER_SHARD:-1}
OPTIONS=$(printf ' %q' "$@")
# shellcheck disable=SC2086  # the sbatch option strings are lists of options
SHARDS=$(sbatch --parsable --job-name=longctx-ruler --array="1-$N" --gpus="$GPUS_PER_SHARD" --cpus-per-task=8 \
    --time=24:00:00 --requeue ${SBATCH_SHARD_OPTIONS:-} \
    --wrap="longctx ruler run $(printf %q "$CKPT") -o $(printf %q "$RUN_DIR") --shard \$SLURM_ARRAY_TASK_ID/$N$OPTIONS")
# shellcheck disable=SC2086
MERGE=$(sbatch --parsable --job-name=longctx-ruler-merge --dependency="afterok:${SHARDS%%;*}" --cpus-per-task=4 \
    --time=2:00:00 ${SBATCH_MERGE_OPTIONS:-} \
    --wrap="longctx ruler merge $(printf %q "$RUN_DIR")")
echo "submitted shards ${SHARDS%%;*} (1-$N) and the merge $MERGE: results in $RUN_DIR"
