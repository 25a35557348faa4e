#!/usr/bin/env bash
# Bus bandwidth of the collectives through meshtrain's comm layer: all_reduce,
# reduce_scatter and all_gather for 4 KiB .. 64 MiB, nccl-tests' algbw/busbw definitions.
# Usage: bench/comm.sh [ranks (default 2)] [flags of meshtrain_bench_comm ...]
# Each rank gets one OpenMP thread; runs as root and with more ranks than cores are allowed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
np="${1:-2}"
[ $# -gt 0 ] && shift
export OMP_NUM_THREADS=1
exec mpirun --oversubscribe --allow-run-as-root -n "$np" "$root/build/meshtrain_bench_comm" "$@"
