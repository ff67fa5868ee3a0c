#!/usr/bin/env bash
# Experiment 07, scheduler overhead and engine throughput. Expected: the real-time machinery costs
# well under 1% of a model step at GPU scale, and the CPU engine's batched decode throughput is what
# the drive/serve experiments ran on.
source "$(dirname "$0")/common.sh"
eval_init 07_overhead "$@"
bench="$(dirname "$BIN")/../bench/realtime_benchmark"
if [ ! -x "$bench" ]; then
  echo "07_overhead: no realtime_benchmark next to $BIN (build the preset's benchmarks)" >&2
  exit 2
fi
record_seed "benchmarks (deterministic)" 0

: >"$OUT/07_runner.csv"
for args in $RUNNER_ARGS; do
  progress "realtime_benchmark BM_WorkloadRunner/sessions:$args x $REPETITIONS"
  # CSV columns (Google Benchmark): name,...,iterations,model_step_ms,overhead_fraction,
  # us_per_iteration; one row per repetition (the aggregate rows are skipped), then the median
  # repetition by time per iteration.
  rows="$("$bench" --benchmark_filter="BM_WorkloadRunner/sessions:$args/" \
    --benchmark_repetitions="$REPETITIONS" --benchmark_format=csv 2>/dev/null |
    awk -F, 'NR > 1 && $1 !~ /_(mean|median|stddev|cv)"?$/ { print $3 "," $11 "," $14 "," $12 "," $13 }' |
    sort -t, -k3 -g)"
  n="$(wc -l <<<"$rows")"
  median="$(sed -n "$(((n + 1) / 2))p" <<<"$rows")"
  echo "${args%%/*},${args##*sim_s:},$median" >>"$OUT/07_runner.csv"
done

: >"$OUT/07_decode.csv"
for c in $DECODE_CASES; do
  IFS=, read -r model sessions context <<<"$c"
  progress "bench-decode $model, $sessions sessions at context $context"
  out="$("$BIN" bench-decode --model "$model" --sessions "$sessions" --context "$context" \
    --steps "$DECODE_STEPS" --threads 1 2>&1)"
  ms="$(awk '/^decode ms per step/ { print $5 }' <<<"$out")"
  tps="$(awk '/^decode tokens\/s/ { print $3 }' <<<"$out")"
  gf="$(awk '/^achieved GFLOP\/s/ { print $3 }' <<<"$out")"
  pf="$(awk '/^peak fraction/ { print $3 }' <<<"$out")"
  echo "$model,$sessions,$context,$ms,$tps,$gf,$pf,${model#synthetic:} N=$sessions C=$context" \
    >>"$OUT/07_decode.csv"
done

{
  echo "**Scheduler overhead** (moshi-7b preset, window W=1000 + 4, AIMD, metrics, forecast; virtual clock, so all wall time is the scheduler; median of $REPETITIONS):"
  echo
  echo "| sessions | simulated s | wall ms | iterations | us per iteration | modelled step ms | overhead / step |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk -F, '{ printf "| %s | %s | %.0f | %d | %.1f | %.1f | %.3f%% |\n", $1, $2, $3, $4, $5, $6, 100 * $7 }' \
    "$OUT/07_runner.csv"
  echo
  echo "**Engine decode throughput** (one thread, fp32, \`metronome bench-decode\`, $DECODE_STEPS steps):"
  echo
  echo "| model | sessions | context | ms per decode step | tokens/s | GFLOP/s | fraction of GEMM peak |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk -F, '{ printf "| %s | %s | %s | %s | %.0f | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }' \
    "$OUT/07_decode.csv"
} >"$OUT/07_overhead.md"

plot "
set output '$OUT/07_overhead.png'
set multiplot layout 1,2 title 'Scheduler overhead and engine throughput' font ',13'
set title 'scheduler cost per iteration vs modelled H200 step'
set style data histograms; set style histogram clustered gap 1
set style fill solid 0.8 noborder; set boxwidth 0.9
set ylabel 'ms (log)'; set logscale y; set yrange [0.001:100]; set key top left
plot '$OUT/07_runner.csv' using (\$5/1000):xtic(sprintf('%s sessions', stringcolumn(1))) lc rgb '#2471a3' title 'scheduler per iteration', \
     '' using 6 lc rgb '#d68910' title 'modelled step'
set yrange [10:300000]
set title 'CPU engine decode tokens/s (1 thread)'
set ylabel 'tokens/s (log)'
set xtics rotate by -15 font ',9'
plot '$OUT/07_decode.csv' using 5:xtic(8) lc rgb '#1e8449' title 'decode'
unset multiplot
"
finish
