#!/usr/bin/env bash
# The local planner's step-time predictions against the engine on this machine: the ten
# layouts of tests/unit/test_planner_local.cc (2-4 ranks, one thread each), each trained for
# 6 steps and predicted on a cluster measured just before it (its fp32 GEMM peak and memory
# bandwidth are printed first). Prints predicted and measured memory and step time side by
# side, and fails when a step time misses by more than 30% in all of its (up to 3) runs.
# Run it on an otherwise idle machine: it is a timing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tests="$root/build/meshtrain_tests"
[ -x "$tests" ] || { echo "build first: $tests is missing" >&2; exit 1; }
OMP_NUM_THREADS=2 MESHTRAIN_TEST_VERBOSE=1 MESHTRAIN_CHECK_PLANNER_TIMES=1 \
  "$tests" --gtest_filter='PlannerLocal.LocalLayoutsMatchTheEngine' | grep -E '^\[ local|OK|FAILED|Failure|predicted'
