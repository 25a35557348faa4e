#!/usr/bin/env bash
# Set up, build and run the whole test suite, then the same engine as other machines and
# tools see it:
#   1. the suite, on the native build (build/);
#   2. an AddressSanitizer + UndefinedBehaviorSanitizer build for an AVX2-only CPU
#      (build-asan/, -march=x86-64-v3) running the single-rank, kernel and CLI tests under
#      ONEDNN_MAX_CPU_ISA=AVX2: what a CPU without AVX-512, bf16 units or AMX runs, with
#      every memory access checked;
#   3. every parser's libFuzzer target for 12 s, its seeds and regressions first.
# Arguments go to the first stage's ctest and skip the others (e.g. -R Bf16 while working).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
jobs="$(nproc)"
cd "$root/build"
echo "== 1/3 the test suite (native build)"
ctest --output-on-failure -j "$jobs" "$@"
(($# == 0)) || exit 0

# configure_and_build DIR TARGETS... -- CMAKE_ARGS...
# Unity builds (MESHTRAIN_UNITY): these directories are built from scratch on a fresh clone,
# where on 2 cores that takes about half the time (the ASan build 7.6 minutes rather than 13).
configure_and_build() {
  local dir="$1"; shift
  local targets=()
  while (($#)) && [ "$1" != "--" ]; do targets+=(--target "$1"); shift; done
  shift
  # Configured every time (a few seconds), so that a folder from an earlier run takes this
  # run's options.
  cmake -S "$root" -B "$root/$dir" -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_UNITY=ON "$@" >/dev/null
  if ! cmake --build "$root/$dir" -j "$jobs" "${targets[@]}" >"$root/$dir/build.log" 2>&1; then
    tail -n 60 "$root/$dir/build.log" >&2
    echo "test: build of $dir failed (full log: $dir/build.log)" >&2
    exit 1
  fi
}

echo "== 2/3 ASan and UBSan, built and run as an AVX2-only machine: single-rank, kernel and CLI tests"
# One build serves both: -march=x86-64-v3 (AVX2, FMA, F16C: no AVX-512 instruction in the
# engine's own code) with oneDNN capped at AVX2 (no AVX-512, bf16 units or AMX). On a CPU
# that has more, that is what an AVX2-only CPU runs; on one that has not, the same. Until
# 2026-12-04 these were two stages with a build each (2.5 minutes for the AVX2 build and 2.3
# for its tests), and the command measured 41.6 minutes in CI.
# Multi-rank suites are left to the native stage (their ranks would run with leak checks
# off anyway: see cli/launch.cc), and so is what the native stage alone runs of the AVX2
# tests before: MixedPrecision's and PlannerLocal.LocalLayouts' multi-rank runs (70 s
# natively), --plan auto's two-rank run. MESHTRAIN_TEST_SANITIZE=0 skips the stage.
if [ "${MESHTRAIN_TEST_SANITIZE:-1}" = 1 ]; then
# The multi-rank suites' files are left out of its test binary (a fifth of the test sources).
# No Python module here (-DMESHTRAIN_PYTHON=OFF): an ASan build cannot be loaded into an
# interpreter without preloading the sanitizer; the native stage runs its tests.
configure_and_build build-asan meshtrain meshtrain_tests -- -DMESHTRAIN_SANITIZE=ON -DMESHTRAIN_MARCH=x86-64-v3 -DMESHTRAIN_PYTHON=OFF \
  '-DMESHTRAIN_TEST_SKIP=test_(hosts|data_parallel|tensor_parallel|llama_parallel|moe_parallel|pipeline|precision)\.cc'
# The suites that touch kernels, precision and the planner's model of this machine must be
# in it: a file left out by mistake would pass unseen.
avx2_suites='CpuKernels|GradCheck|Bf16|Fp16|CpuInfo|MachineJson|PeakCache|KvCacheDecoder|TorchParity|Offload\.Bf16|PlannerLocal|PlanAuto|PlannerSearch'
for suite in ${avx2_suites//|/ }; do
  # (grep -c reads to the end: grep -q would close the pipe on ctest, failing it under pipefail.)
  if [ "$(ctest --test-dir "$root/build-asan" -N -R "^$suite" | grep -c 'Test *#')" = 0 ]; then
    echo "test: no test of $suite in build-asan: its file is left out (MESHTRAIN_TEST_SKIP in scripts/test.sh)" >&2
    exit 1
  fi
done
multi_rank='^(Hosts|DataParallel|TensorParallel|LlamaParallel|MoeParallel|Pipeline|MixedPrecision|PlannerLocal\.LocalLayouts|mpi\.|docs\.user_guide)'
# Also left to the native stage, for time (the whole command stays under 40 minutes on 2
# cores; it measured 42 minutes with them): the planner's searches over published runs and
# long-context layouts (90 s and 19 s here under the sanitizers; arithmetic on GPU presets,
# the same on any CPU; the second moved 2026-12-08, when the command measured 41.6 minutes
# on a Xeon without AMX), --plan auto's
# two-rank run and the offload suite's fp32 CLI runs (its bf16 one runs here).
multi_rank="${multi_rank%)}|PlannerSearch\.(PublishedLayouts|LongContextLayouts)|PlanAuto\.RunsTheChosenLayout"
# The asynchronous-save test's three two-rank runs (42 s under the sanitizers), and the
# curriculum's two-rank runs (dp 2 and pp 2; tp 2 with sp), and compression's multi-rank
# runs (its refusals run here).
multi_rank="$multi_rank|Cli\.AsyncSaveSurvivesAKillDuringTheWrite|CurriculumCli\.(DpAndPpLayoutsTrainLikeOneRank|SpLengthsAreCheckedBeforeTraining)"
multi_rank="$multi_rank|CompressCli\.(PowerSgd|OneBitAdam|BothTrain|ZeroPlusPlus)"
# Two CLI runs whose code the sanitizers see in the checkpoint and export tests that stay
# here (Cli.ResumeIsBitwiseExact, Cli.ExportAndInitFromRoundTrip), left to the native stage
# for time (33 s and 31 s under the sanitizers).
multi_rank="$multi_rank|Cli\.ResumeAtAnotherPrecision|CliPractitioner\.LlamaExportsAsAHuggingFaceFolder"
# The run-safety tests that start ranks under mpirun (a signal at pp 2 and dp 2, the
# launcher killed at dp 2); their one-rank cases run here.
multi_rank="$multi_rank|RunSafety\.(SignalsStopEveryRankAtTheSameStep|RanksEndWithTheirLauncher)"
# generate's and serve's tp, pp and dp runs (mpirun; the decoder's split runs here on thread
# ranks).
multi_rank="$multi_rank|CliPractitioner\.(GenerateOnAnyLayoutPrintsOneRanksText|ServeOnTensorAndPipelineRanksAnswersAsOneRank)"
multi_rank="$multi_rank|Offload\.(OffloadedTrainingIsBitIdentical|ResumeAfterACrash|MemoryBudgetOffloadsAndStaysUnder"
# ZeRO-Infinity's CLI runs too (70 s natively); its in-process test (the I/O thread, the
# shard buffers, every rank count) runs here.
multi_rank="$multi_rank|Zero3ShardsInFilesTrainAsInMemory|MemoryBudgetMovesShardsToo))"
# The guards' two-rank runs.
multi_rank="$multi_rank|Guards\.(WatchdogSummaryBlamesTheRankBehind|EveryRankRefusesARunTooLargeForItsShare)"
# Context parallelism's matrix runs one cell per mode and family here (MESHTRAIN_CP_CELLS):
# its whole matrix, held to one rank in the native stage, took 353 s under the sanitizers
# (2026-12-07, when the command measured 47 minutes).
MESHTRAIN_CP_CELLS=sanitize ONEDNN_MAX_CPU_ISA=AVX2 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  UBSAN_OPTIONS=print_stacktrace=1 LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0" \
  ctest --test-dir "$root/build-asan" --output-on-failure -j "$jobs" -E "$multi_rank"
else
  echo "skipped (MESHTRAIN_TEST_SANITIZE=0)"
fi

echo "== 3/3 fuzzing every parser"
# 12 s per target (two at a time; its seeds and regressions first): the budget left by the
# stages above (30 s until 2026-12-04, when the whole command measured 43 minutes; 20 s
# until it measured 42 minutes again that evening).
"$root/tests/fuzz/run.sh" "${MESHTRAIN_FUZZ_SECONDS:-12}"
