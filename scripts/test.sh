#!/usr/bin/env bash
# The test job (CI runs exactly this): set up, check formatting, layering and docs, build with
# warnings as errors and run every test, clang-tidy, the evaluation suite's quick mode, then the
# unit tests again under ASan + UBSan, the threaded tests (server, realtime, loadgen) under
# ThreadSanitizer, then smoke-run the GGUF and wire protocol fuzzers.
# Fails loudly on the first problem.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${METRONOME_JOBS:-$(nproc)}"

bash scripts/setup.sh

echo "== format check (clang-format)"
git ls-files '*.h' '*.cc' | xargs clang-format --dry-run --Werror

echo "== layering (a module includes and links only the modules below it: docs/architecture.md)"
python3 scripts/check_layering.py

echo "== docs (README <= 150 lines, performance.md <= 400, no dated run logs, no dangling doc references)"
python3 scripts/check_docs.py

echo "== Kubernetes manifests (deploy/kubernetes: schemas, haproxy -c, broken copies rejected)"
bash scripts/validate_manifests.sh

echo "== build + test (ci preset: optimised, -Werror)"
cmake --preset ci >/dev/null
cmake --build --preset ci -j "$jobs"
ctest --preset ci -j "$jobs"

echo "== clang-tidy (all sources, warnings as errors; -Wthread-safety checks the lock annotations)"
bash scripts/tidy.sh build/ci

echo "== benchmark smoke run"
build/ci/bench/kernels_benchmark --benchmark_min_time=0.01 >/dev/null
build/ci/bench/quant_benchmark \
  --benchmark_filter="BM_Prefill/type:(3|8)/m:(1|16)/|BM_ExpertsDram/type:8/m:8/placement:2" \
  --benchmark_min_time=0.01 >/dev/null
build/ci/apps/metronome bench-decode --model synthetic:tiny --sessions 4 --context 64 --steps 4 \
  >/dev/null

echo "== evaluation suite, quick mode (experiments/eval; outputs in build/eval/quick)"
bash experiments/eval/run.sh --quick --bin build/ci/apps/metronome

if [ "${METRONOME_CONTAINER_TEST:-0}" = 1 ]; then
  echo "== container image (deploy/Dockerfile's runtime stage around the ci binary)"
  bash scripts/setup.sh --container
  bash scripts/container_test.sh --bin build/ci/apps/metronome
fi

echo "== ASan + UBSan (unit tests)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"

echo "== ThreadSanitizer (thread pool, server, realtime and loadgen tests; the preset builds only those)"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs"
ctest --preset tsan -j "$jobs"

echo "== GGUF parser fuzz smoke run (libFuzzer, 30 s)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs" --target gguf_fuzzer
mkdir -p build/fuzz/corpus
build/fuzz/tests/fuzz/gguf_fuzzer -max_total_time=30 -rss_limit_mb=2048 build/fuzz/corpus \
  tests/fuzz/corpus/gguf
echo "== wire protocol fuzz smoke run (libFuzzer, 30 s)"
cmake --build --preset fuzz -j "$jobs" --target protocol_fuzzer
mkdir -p build/fuzz/protocol_corpus
build/fuzz/tests/fuzz/protocol_fuzzer -max_total_time=30 -rss_limit_mb=2048 \
  build/fuzz/protocol_corpus tests/fuzz/protocol_corpus
echo "== all checks passed"
