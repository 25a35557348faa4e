#!/usr/bin/env bash
# The timing checks that the test command leaves out (the machines are shared and noisy),
# run on request with MESHTRAIN_CHECK_TIMINGS=1; run this on an otherwise idle machine.
#  1. The local planner's step-time predictions against the engine: the fourteen layouts of
#     tests/unit/test_planner_local.cc (2-4 ranks, one thread each), 6 steps each, predicted
#     on a cluster measured just before (its fp32 GEMM peak and memory bandwidth are printed
#     first); predicted and measured memory and step time side by side, failing when a step
#     time misses by more than 30% in all of its (up to 3) runs.
#  2. The pipeline's measured bubble against the schedule's (p-1)/(v*m+p-1), within 0.08,
#     and falling with m and v (tests/unit/test_pipeline.cc, MeasuredBubbleMatchesTheSchedule).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tests="$root/build/meshtrain_tests"
[ -x "$tests" ] || { echo "build first: $tests is missing" >&2; exit 1; }
export OMP_NUM_THREADS=2 MESHTRAIN_TEST_VERBOSE=1 MESHTRAIN_CHECK_TIMINGS=1
status=0
"$tests" --gtest_filter='PlannerLocal.LocalLayoutsMatchTheEngine' |
  grep -E '^\[ local|OK \]|FAILED  \]|Failure|predicted' || status=1
"$tests" --gtest_filter='Pipeline.MeasuredBubbleMatchesTheSchedule' |
  grep -E '^\[ bubble|OK \]|FAILED  \]|Failure|measured' || status=1
exit $status
