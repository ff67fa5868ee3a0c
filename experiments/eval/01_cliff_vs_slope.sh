#!/usr/bin/env bash
# Experiment 01, cliff vs slope: per-frame latency and output tokens per frame over time and
# against N, full KV vs window KV. Expected: full KV is flat, then a wall (frames handed back empty
# at the deadline, which the mute alarms flag, while the deadline metric stays clean); window KV's
# latency rises smoothly with N and it never starves.
source "$(dirname "$0")/common.sh"
eval_init 01_cliff_vs_slope "$@"
sim=(sim --preset "$PRESET" --seed "$SEED")
record_seed "sim $PRESET" "$SEED"

# 1. Over time, N_TIME sessions.
for kv in full window; do
  progress "$PRESET, $N_TIME sessions, $kv KV, ${DURATION_S} s"
  summary "${sim[@]}" --sessions "$N_TIME" --kv "$kv" --admission "static:$N_TIME" \
    --duration "$DURATION_S" --timeseries-out "$OUT/01_time_$kv.csv" >"$OUT/01_time_$kv.json"
done

# 1b. The other presets over time (table rows only).
for spec in $OTHER_PRESETS; do
  IFS=: read -r other n dur <<<"$spec"
  record_seed "sim $other" "$SEED"
  for kv in full window; do
    progress "$other, $n sessions, $kv KV, ${dur} s"
    summary sim --preset "$other" --seed "$SEED" --sessions "$n" --kv "$kv" --admission "static:$n" \
      --duration "$dur" --timeseries-out "$OUT/01_other_${other}_$kv.csv" \
      >"$OUT/01_other_${other}_$kv.json"
  done
done

# 2. Against N.
: >"$OUT/01_sweep.csv"
for n in $N_SWEEP; do
  for kv in full window; do
    progress "$PRESET, N=$n, $kv KV, ${SWEEP_S} s"
    j="$(summary "${sim[@]}" --sessions "$n" --kv "$kv" --admission "static:$n" \
      --duration "$SWEEP_S")"
    printf '%s,%s,%s,%s,%s,%s,%s\n' "$n" "$kv" "$(jget "$j" p50_frame_latency_ms)" \
      "$(jget "$j" p99_frame_latency_ms)" "$(jget "$j" frames)" "$(jget "$j" starved_frames)" \
      "$(jget "$j" mute_alarms)" >>"$OUT/01_sweep.csv"
  done
done

# 3. The real engine and clock.
for kv in full window; do
  progress "drive synthetic:tiny, $DRIVE_N sessions, $kv KV, ${DRIVE_S} s"
  extra=()
  if [ "$kv" = window ]; then extra=(--window 32 --sinks 4 --positions absolute); fi
  summary drive --model synthetic:tiny --sessions "$DRIVE_N" --admission "static:$DRIVE_N" \
    --kv-blocks "$DRIVE_BLOCKS" --period-ms 40 --tokens-per-frame 2 --threads 1 \
    --duration "$DRIVE_S" --kv "$kv" "${extra[@]}" --timeseries-out "$OUT/01_drive_$kv.csv" \
    >"$OUT/01_drive_$kv.json"
done
record_seed "drive synthetic:tiny (model seed)" 1

# 3b. The same sessions over the network: serve (the same pool) + loadgen on loopback, measured on
# the client; loadgen's frame trace (t_s, session, frame, outcome, latency_ms, ..., outputs) gives
# the end's tokens per frame.
for kv in full window; do
  progress "serve + loadgen synthetic:tiny, $DRIVE_N sessions, $kv KV, ${DRIVE_S} s"
  extra=()
  if [ "$kv" = window ]; then extra=(--window 32 --sinks 4 --positions absolute); fi
  # The server's own default session (for clients naming no KV) must fit this small pool too.
  tiny_serve --kv-blocks "$DRIVE_BLOCKS" --window 32 --sinks 4 --positions absolute --admission "static:$DRIVE_N"
  summary loadgen --url "$SERVE_URL" --sessions "$DRIVE_N" --period-ms 40 --tokens-per-frame 2 \
    --duration "$DRIVE_S" --kv "$kv" "${extra[@]}" --seed "$SEED" --report-every 0 \
    --events-out "$OUT/01_serve_$kv.frames.csv" >"$OUT/01_serve_$kv.json"
  tiny_serve_stop
done

# Tokens per frame over the last tenth of a run (the conversation's pulse at the end).
tail_tokens() {
  awk -F, -v from="$2" 'NR > 1 && $1 >= from && $14 > 0 { f += $14; t += $14 * $17 }
    END { if (f > 0) printf "%.2f", t / f; else printf "-" }' "$1"
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f%%", 100 * a / b; else print "-" }'; }
fmt() { if [ "$1" = null ] || [ -z "$1" ]; then echo "-"; else printf '%.1f' "$1"; fi; }

{
  echo "**Over time** (simulated H200: each preset's default window for window KV; real engine: synthetic:tiny, $DRIVE_N sessions, $DRIVE_BLOCKS-block pool, window W=32 + 4, ${DRIVE_S} s):"
  echo
  echo "| run | KV | first starved frame (s) | starved frames | mute alarms | deadline misses | p99 latency (ms) | deadline (ms) | output tokens/frame, last 10% |"
  echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  runs=(time)
  for spec in $OTHER_PRESETS; do runs+=("other_${spec%%:*}"); done
  runs+=(drive serve)
  for run in "${runs[@]}"; do
    for kv in full window; do
      j="$(cat "$OUT/01_${run}_$kv.json")"
      dur=$DURATION_S
      label="$PRESET, N=$N_TIME"
      if [ "$run" = drive ]; then dur=$DRIVE_S; label="synthetic:tiny (CPU), N=$DRIVE_N"; fi
      if [ "$run" = serve ]; then
        dur=$DRIVE_S
        label="synthetic:tiny (CPU), N=$DRIVE_N, serve + loadgen (client clock)"
      fi
      if [[ "$run" == other_* ]]; then
        spec="$(tr ' ' '\n' <<<"$OTHER_PRESETS" | grep "^${run#other_}:")"
        IFS=: read -r other n dur <<<"$spec"
        label="$other, N=$n"
      fi
      from=$(awk -v d="$dur" 'BEGIN { print 0.9 * d }')
      if [ "$run" = serve ]; then
        tail="$(awk -F, -v from="$from" 'NR > 1 && $1 >= from { f++; t += $8 }
          END { if (f > 0) printf "%.2f", t / f; else printf "-" }' "$OUT/01_serve_$kv.frames.csv")"
      else
        tail="$(tail_tokens "$OUT/01_${run}_$kv.csv" "$from")"
      fi
      echo "| $label | $kv | $(fmt "$(jget "$j" first_starved_at_s)") | $(pct "$(jget "$j" starved_frames)" "$(jget "$j" frames)") | $(jget "$j" mute_alarms) | $(jget "$j" deadline_misses) | $(fmt "$(jget "$j" p99_frame_latency_ms)") | $(jget "$j" deadline_ms) | $tail |"
    done
  done
  echo
  echo "**Against N** ($PRESET, ${SWEEP_S} s per run; starved = frames handed back empty):"
  echo
  echo "| N | full: p50 / p99 (ms) | full: starved | full: mute alarms | window: p50 / p99 (ms) | window: starved |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
  for n in $N_SWEEP; do
    f="$(grep "^$n,full," "$OUT/01_sweep.csv")"
    w="$(grep "^$n,window," "$OUT/01_sweep.csv")"
    IFS=, read -r _ _ fp50 fp99 ff fs fa <<<"$f"
    IFS=, read -r _ _ wp50 wp99 wf ws _ <<<"$w"
    echo "| $n | $(fmt "$fp50") / $(fmt "$fp99") | $(pct "$fs" "$ff") | $fa | $(fmt "$wp50") / $(fmt "$wp99") | $(pct "$ws" "$wf") |"
  done
} >"$OUT/01_cliff_vs_slope.md"

deadline="$(jget "$(cat "$OUT/01_time_full.json")" deadline_ms)"
plot "
set output '$OUT/01_cliff_vs_slope.png'
set multiplot layout 1,3 title '$PRESET: full KV vs window KV (W=1000 + 4 sinks)' font ',13'
set title 'p99 frame latency per 0.5 s, N=$N_TIME'
set xlabel 'time (s)'; set ylabel 'ms'; set yrange [0:*]
plot '$OUT/01_time_full.csv' every ::1 using 1:16 with lines lc rgb '#c0392b' title 'full KV', \
     '$OUT/01_time_window.csv' every ::1 using 1:16 with lines lc rgb '#2471a3' title 'window KV', \
     $deadline with lines dt 2 lc rgb '#555555' title 'deadline'
set title 'output tokens per frame, N=$N_TIME'
set ylabel 'tokens'; set yrange [0:1.2]
plot '$OUT/01_time_full.csv' every ::1 using 1:17 with lines lc rgb '#c0392b' title 'full KV', \
     '$OUT/01_time_window.csv' every ::1 using 1:17 with lines lc rgb '#2471a3' title 'window KV'
set title 'against N (${SWEEP_S} s runs)'
set xlabel 'sessions N'; set ylabel 'p99 ms (lines), starved % (bars)'; set yrange [0:*]; set xtics 50; set xrange [0:*]
set style fill solid 0.35 noborder; set boxwidth 8
plot '< grep full $OUT/01_sweep.csv' using 1:(100*\$6/\$5) with boxes lc rgb '#c0392b' title 'full: starved %', \
     '< grep full $OUT/01_sweep.csv' using 1:4 with linespoints pt 7 lc rgb '#c0392b' title 'full: p99', \
     '< grep window $OUT/01_sweep.csv' using 1:4 with linespoints pt 7 lc rgb '#2471a3' title 'window: p99', \
     $deadline with lines dt 2 lc rgb '#555555' title 'deadline'
unset multiplot
"
finish
