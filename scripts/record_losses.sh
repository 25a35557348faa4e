#!/usr/bin/env bash
# Records what training computes, to show that a change of structure changes no number:
# every parity cell of the multi-rank suites (each step's loss and grad norm as written, and
# a hash of every checkpoint's weights) and every run of the user guide (losses and grad
# norms), under OUT/. Run it before and after, then compare: equal records mean bit-for-bit
# equal training.
# Usage: scripts/record_losses.sh OUT [BUILD_DIR]
#        scripts/record_losses.sh --compare BEFORE AFTER
# (--compare masks the test folders' process ids in the runs' flags.)
set -euo pipefail
if [ "${1:-}" = --compare ]; then
  status=0
  for before in "$2"/*.txt; do
    name="$(basename "$before")"
    mask() { sed -E 's/meshtrain_[A-Za-z_]+_[0-9]+/meshtrain_TEST/g' "$1"; }
    if [ ! -f "$3/$name" ]; then echo "$name: missing from $3"; status=1
    elif diff <(mask "$before") <(mask "$3/$name") >/dev/null; then echo "$name: the same ($(grep -c '^run' "$before") runs)"
    else echo "$name: DIFFERS"; diff <(mask "$before") <(mask "$3/$name") | head -n 6 || true; status=1; fi
  done
  exit $status
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "$1")"
build="$(realpath "${2:-$root/build}")"
rm -rf "$out" && mkdir -p "$out"
MESHTRAIN_TEST_RECORD="$out" ctest --test-dir "$build" -j "$(nproc)" --output-on-failure \
  -R '^(DataParallel|TensorParallel|LlamaParallel|MoeParallel|Pipeline|MixedPrecision)$'
MESHTRAIN_GUIDE_RECORD="$out/user_guide.txt" "$root/tests/docs/run_user_guide.sh" "$build/meshtrain" >"$out/user_guide.log" 2>&1
wc -l "$out"/*.txt
