#!/usr/bin/env bash
# Builds the parsers' libFuzzer targets, replays every kept regression input and every seed
# (none may crash), then fuzzes each target for a bounded time, two at a time (this machine
# has two cores), and prints one summary line per target. Exits non-zero on any crash, and
# keeps each crashing input under the build folder's artifacts/ for tests/fuzz/regressions/.
#
#   tests/fuzz/run.sh [seconds_per_target]       (default 60)
# Environment: MESHTRAIN_FUZZ_BUILD (build folder, default build-fuzz at the repository
# root), MESHTRAIN_FUZZ_JOBS (targets fuzzed at once, default 2), CXX (default clang++).
set -uo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
fuzz_dir="$root/tests/fuzz"
build="${MESHTRAIN_FUZZ_BUILD:-$root/build-fuzz}"
jobs="${MESHTRAIN_FUZZ_JOBS:-2}"
targets=(fuzz_checkpoint_index fuzz_safetensors fuzz_llmc_model fuzz_token_file
         fuzz_config_toml fuzz_cluster_file fuzz_bpe_files fuzz_http_request fuzz_tokenizer_json)

# ---- build ----
start=$SECONDS
mkdir -p "$build"
if ! { cmake -S "$fuzz_dir" -B "$build" -DCMAKE_CXX_COMPILER="${CXX:-clang++}" > "$build/configure.log" 2>&1 &&
       cmake --build "$build" -j 2 > "$build/build.log" 2>&1; }; then
  cat "$build/configure.log" "$build/build.log" | tail -40
  echo "fuzz: build failed (logs: $build/configure.log, $build/build.log)"
  exit 2
fi
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - start)) s into $build"

# ---- replay: every regression input and seed must pass ----
replay_failed=0
for t in "${targets[@]}"; do
  inputs=()
  for d in "$fuzz_dir/regressions/$t" "$fuzz_dir/corpus/$t"; do
    [[ -d "$d" ]] && while IFS= read -r -d '' f; do inputs+=("$f"); done < <(find "$d" -type f -print0 | sort -z)
  done
  if [[ ${#inputs[@]} -eq 0 ]]; then
    echo "fuzz: replay $t: no inputs"
    continue
  fi
  if "$build/$t" -runs=1 "${inputs[@]}" > "$build/$t.replay.log" 2>&1; then
    echo "fuzz: replay $t: ${#inputs[@]} inputs pass"
  else
    echo "fuzz: replay $t: CRASH (log: $build/$t.replay.log)"
    tail -30 "$build/$t.replay.log"
    replay_failed=1
  fi
done

# ---- fuzz: each target for $seconds, at most $jobs at a time ----
# A target's new inputs go to a working corpus under the build folder, never into the
# source tree; the seeds and regressions are read-only extra corpora.
fuzz_one() {
  local t="$1" work="$build/work/$t" artifacts="$build/artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  local corpora=("$work")
  for d in "$fuzz_dir/corpus/$t" "$fuzz_dir/regressions/$t"; do [[ -d "$d" ]] && corpora+=("$d"); done
  "$build/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts" "${corpora[@]}" > "$build/$t.fuzz.log" 2>&1
  echo $? > "$build/$t.fuzz.rc"
}

for t in "${targets[@]}"; do rm -f "$build/$t.fuzz.rc"; done
for t in "${targets[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n; done
  echo "fuzz: running $t for $seconds s"
  fuzz_one "$t" &
done
wait

# ---- report ----
crashed=$replay_failed
summary=()
for t in "${targets[@]}"; do
  log="$build/$t.fuzz.log"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" 2>/dev/null | grep -o '[0-9]*$' | tail -1)
  rc=$(cat "$build/$t.fuzz.rc" 2>/dev/null || echo "?")
  found=$(find "$build/artifacts/$t" -type f 2>/dev/null | sort)
  if [[ "$rc" == 0 && -z "$found" ]]; then
    result="no crash"
  else
    crashed=1
    result="CRASH (exit $rc): $(grep -m1 -E 'ERROR|broken promise|runtime error|deadly signal' "$log" 2>/dev/null)"
    [[ -n "$found" ]] && result="$result; input: $(echo $found)"
  fi
  summary+=("$(printf '%-22s %10s execs in %s s, %s' "$t" "${execs:-?}" "$seconds" "$result")")
done
echo "fuzz: summary ($(date -u +%Y-%m-%d), clang $("${CXX:-clang++}" -dumpversion), ASan+UBSan+libFuzzer):"
printf '  %s\n' "${summary[@]}"
if [[ $crashed -ne 0 ]]; then
  echo "fuzz: FAILED: keep each crashing input in tests/fuzz/regressions/<target>/ and fix the parser"
  exit 1
fi
echo "fuzz: all targets passed"
