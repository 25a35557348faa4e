#!/usr/bin/env bash
# Runs a command that must be ended by the comm watchdog (ctest mpi.comm.watchdog):
#   expect_watchdog.sh <mpirun ...> meshtrain_mpi_tests --gtest_filter=Watchdog.*
# Passes when the command exits non-zero within 30 s and its stderr carries the watchdog's
# message. MESHTRAIN_WATCHDOG_TEST=1 enables the test case (it skips otherwise).
set -uo pipefail
export MESHTRAIN_WATCHDOG_TEST=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
max_s=30
want="comm timeout: all_reduce on axis world at step"
err="$(mktemp)"
trap 'rm -f "$err"' EXIT

start_ms=$(( $(date +%s%N) / 1000000 ))
timeout --kill-after=5 $((max_s + 30)) "$@" 2>"$err"
rc=$?
elapsed_ms=$(( $(date +%s%N) / 1000000 - start_ms ))
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"

echo "--- stderr of the job (exit code $rc, ${elapsed} s) ---"
cat "$err"
echo "---"
fail=0
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the job exited with code 0; the watchdog should have aborted it"; fail=1
fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: the job hung and was killed by timeout"; fail=1
fi
if (( elapsed_ms > max_s * 1000 )); then
  echo "FAIL: the job took ${elapsed} s, more than ${max_s} s"; fail=1
fi
if ! grep -qF "$want" "$err"; then
  echo "FAIL: stderr lacks \"$want\""; fail=1
fi
if ! grep -qE '^\[rank 0\] meshtrain: error: comm timeout: all_reduce on axis world at step 42 on rank 0 did not finish within 2 s$' "$err"; then
  echo "FAIL: stderr lacks rank 0's full watchdog line"; fail=1
fi
[ "$fail" -eq 0 ] && echo "PASS: watchdog aborted the job (exit code $rc) after ${elapsed} s"
exit "$fail"
