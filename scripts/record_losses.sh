#!/usr/bin/env bash
# Records what training computes, to show that a change of structure changes no number:
# every parity cell of the multi-rank suites (each step's loss and grad norm as written, and
# a hash of every checkpoint's weights) and every run of the user guide (losses and grad
# norms), under OUT/. Run it before and after, then `diff -r BEFORE AFTER`: equal files mean
# bit-for-bit equal training. Usage: scripts/record_losses.sh OUT [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "$1")"
build="$(realpath "${2:-$root/build}")"
rm -rf "$out" && mkdir -p "$out"
MESHTRAIN_TEST_RECORD="$out" ctest --test-dir "$build" -j "$(nproc)" --output-on-failure \
  -R '^(DataParallel|TensorParallel|LlamaParallel|MoeParallel|Pipeline|MixedPrecision)$'
MESHTRAIN_GUIDE_RECORD="$out/user_guide.txt" "$root/tests/docs/run_user_guide.sh" "$build/meshtrain" >"$out/user_guide.log" 2>&1
wc -l "$out"/*.txt
