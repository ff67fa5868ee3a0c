#!/usr/bin/env bash
# Experiment 02, metastability: identical configurations, different arrival/duration seeds; does
# the full-KV pool fill and sessions go mute? Same seeds with window KV.
#   bash experiments/eval/02_metastability.sh [--quick] [--bin PATH] [--out DIR]
# Parameters and their derivation: 02_metastability.conf.
# Collapse (per run): mute_alarms >= 1, i.e. some session had MUTE_AFTER (3) consecutive starved
# frames. "Severe" (reported beside it): starved frames > SEVERE_PCT (1) % of all frames.
# Writes $OUT/02_metastability.{md,png,seeds} and the per-run timeseries CSVs under
# $OUT/02_metastability/.
source "$(dirname "$0")/common.sh"
eval_init 02_metastability "$@"

DATA="$OUT/02_metastability"
mkdir -p "$DATA"
MD="$OUT/02_metastability.md"

# cell VALUE: "–" for a null/empty summary value.
cell() { if [ -z "$1" ] || [ "$1" = null ]; then printf '–'; else printf '%s' "$1"; fi; }

{
  echo "Collapse = at least one mute alarm (a session had $MUTE_AFTER consecutive frames handed back"
  echo "empty for want of a KV block); severe = starved frames > ${SEVERE_PCT}% of all frames. A row's"
  echo "two runs share the seed and every flag but \`--kv\`."
  echo
} >"$MD"

# run_args PRESET KV: the command line of one run (the global array ARGS); "cpu": the real engine.
run_args() {
  if [ "$1" = cpu ]; then
    ARGS=(drive --model synthetic:tiny --threads 1 --period-ms "$CPU_PERIOD_MS"
      --tokens-per-frame "$CPU_TOKENS_IN" --output-tokens-per-frame "$CPU_TOKENS_OUT"
      --kv-blocks "$CPU_BLOCKS")
    engine_kv_args "$2" "$CPU_WINDOW"
    ARGS+=("${KV_ARGS[@]}")
  else
    ARGS=(sim --preset "$1")
  fi
  ARGS+=(--arrival "${ARRIVAL[$1]}" --session-duration "${LIFETIME[$1]}"
    --admission "${ADMISSION[$1]}" --duration "${DURATION[$1]}" --mute-after "$MUTE_AFTER"
    --kv "$2")
}

plot_cmds=()
horizon_rows=()
panel=0
for preset in "${PRESETS[@]}"; do
  panel=$((panel + 1))
  key="${preset//[^A-Za-z0-9]/_}"
  {
    echo "**$(run_label "$preset")**: arrivals \`${ARRIVAL[$preset]}\`, lifetimes \`${LIFETIME[$preset]}\` s," \
      "admission \`${ADMISSION[$preset]}\`, ${DURATION[$preset]} s per run, ${NSEEDS[$preset]} seeds"
    echo
    echo "| seed | full: collapsed | first starved (s) | starved % | mute alarms | KV peak | window: collapsed | first starved (s) | starved % | mute alarms | KV peak |"
    echo "| ---: | :---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: |"
  } >>"$MD"
  declare -A n_collapsed=([full]=0 [window]=0) n_severe=([full]=0 [window]=0)
  rejected_total=0
  full_collapsed_files=()
  full_survived_files=()
  window_files=()
  for ((i = 0; i < ${NSEEDS[$preset]}; i++)); do
    seed=$((SEED_FIRST + i))
    record_seed "$(run_label "$preset")" "$seed"
    # The seed's two runs side by side (2 cores; the real engine's runs are light: a few
    # sessions of a tiny model, and what decides collapse here is memory, not time).
    pids=()
    for kv in full window; do
      if have "$DATA/${key}_${kv}_seed${seed}.json" "$DATA/${key}_${kv}_seed${seed}.csv"; then
        continue
      fi
      run_args "$preset" "$kv"
      summary "${ARGS[@]}" --seed "$seed" --timeseries-out "$DATA/${key}_${kv}_seed${seed}.csv" \
        >"$DATA/${key}_${kv}_seed${seed}.json" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    row="| $seed"
    for kv in full window; do
      csv="$DATA/${key}_${kv}_seed${seed}.csv"
      s=$(cat "$DATA/${key}_${kv}_seed${seed}.json")
      frames=$(jget "$s" frames)
      starved=$(jget "$s" starved_frames)
      alarms=$(jget "$s" mute_alarms)
      first=$(jget "$s" first_starved_at_s)
      peak=$(jget "$s" kv_peak_fraction)
      rejected_total=$((rejected_total + $(jget "$s" rejected)))
      pct=$(awk -v s="$starved" -v f="$frames" 'BEGIN { printf "%.2f", (f > 0 ? 100 * s / f : 0) }')
      collapsed=no
      if ((alarms > 0)); then
        collapsed=YES
        n_collapsed[$kv]=$((n_collapsed[$kv] + 1))
      fi
      if awk -v s="$starved" -v f="$frames" -v p="$SEVERE_PCT" 'BEGIN { exit !(f > 0 && 100 * s > p * f) }'; then
        n_severe[$kv]=$((n_severe[$kv] + 1))
        collapsed="$collapsed (severe)"
      fi
      if [ "$first" != null ]; then first=$(printf '%.1f' "$first"); fi
      row+=" | $collapsed | $(cell "$first") | $pct | $alarms | $(printf '%.3f' "$peak")"
      case "$kv" in
        full) if ((alarms > 0)); then full_collapsed_files+=("$csv"); else full_survived_files+=("$csv"); fi ;;
        window) window_files+=("$csv") ;;
      esac
    done
    echo "$row |" >>"$MD"
    progress "$(run_label "$preset") seed $seed: full ${n_collapsed[full]} collapsed so far, window ${n_collapsed[window]}"
  done
  # Collapse against the horizon: a full-KV run has collapsed by time t if its first mute alarm
  # (the timeseries' cumulative mute_alarms, column 11) came at or before t.
  hrow="| $(run_label "$preset") |"
  for q in 1 2 3 4; do
    t=$(awk -v d="${DURATION[$preset]}" -v q="$q" 'BEGIN { print d * q / 4 }')
    k=0
    for f in "${full_collapsed_files[@]}"; do
      if awk -F, -v t="$t" 'NR > 1 && $11 > 0 { found = ($1 <= t); exit } END { exit !found }' "$f"; then
        k=$((k + 1))
      fi
    done
    hrow+=" $k/${NSEEDS[$preset]} by ${t} s |"
  done
  horizon_rows+=("$hrow")
  {
    echo
    echo "collapses ($(run_label "$preset")): full ${n_collapsed[full]}/${NSEEDS[$preset]}, window ${n_collapsed[window]}/${NSEEDS[$preset]}" \
      "(severe: full ${n_severe[full]}/${NSEEDS[$preset]}, window ${n_severe[window]}/${NSEEDS[$preset]});" \
      "sessions rejected by admission over all $((2 * NSEEDS[$preset])) runs: $rejected_total"
    echo
  } >>"$MD"
  progress "$(run_label "$preset"): collapses full ${n_collapsed[full]}/${NSEEDS[$preset]}, window ${n_collapsed[window]}/${NSEEDS[$preset]}"

  # One panel per preset: KV occupancy (column 4) over time (column 1), one line per run; full KV
  # in reds (dark: collapsed, light: survived), window KV in blues.
  # At most ~250 points a line: 100 runs of dense lines make a PNG of megabytes otherwise.
  stride=$(($(wc -l <"${window_files[0]}") / 250 + 1))
  items=()
  first_item=1
  add_items() { # COLOUR TITLE FILES...
    local colour="$1" title="$2" f t
    shift 2
    for f in "$@"; do
      if ((first_item)); then t="title \"$title\""; else t="notitle"; fi
      [ "$title" = "" ] && t="notitle"
      items+=("\"$f\" every $stride::1 using 1:4 with lines lw 0.8 lc rgb \"$colour\" $t")
      title=""
    done
  }
  add_items "#F4A582" "full KV, survived (${#full_survived_files[@]})" "${full_survived_files[@]}"
  add_items "#B2182B" "full KV, collapsed (${#full_collapsed_files[@]})" "${full_collapsed_files[@]}"
  add_items "#2166AC" "window KV (${n_collapsed[window]}/${#window_files[@]} collapsed)" "${window_files[@]}"
  plot_cmds+=("set title \"$(run_label "$preset"): ${ARRIVAL[$preset]}, lifetimes ${LIFETIME[$preset]} s, ${ADMISSION[$preset]}; collapses: full ${n_collapsed[full]}/${NSEEDS[$preset]}, window ${n_collapsed[window]}/${NSEEDS[$preset]}\"
set xrange [0:${DURATION[$preset]}]
plot $(IFS=,; echo "${items[*]}")")
  unset n_collapsed n_severe
done
{
  echo "Full-KV collapses against the horizon H (a run counts from its first mute alarm): the"
  echo "collapse rate is a property of load and run length, not a constant."
  echo
  echo "| runs | H/4 | H/2 | 3H/4 | H |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${horizon_rows[@]}"
  echo
} >>"$MD"

npanels=${#PRESETS[@]}
height=$((80 + 520 * npanels))
plot "set terminal pngcairo size 1100,$height font \"DejaVu Sans,11\" linewidth 1.5
set output \"$OUT/02_metastability.png\"
set multiplot layout $npanels,1
set xlabel \"time (s)\"
set ylabel \"KV pool used (fraction)\"
set yrange [0:1.08]
set key bottom right box lc rgb \"#cccccc\" opaque
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lw 1.5 lc rgb \"#000000\" front
set label 1 \"pool full: the next block request starves a frame; $MUTE_AFTER starved in a row = mute alarm = collapse\" at graph 0.01, first 1.04 font \",9\" front
$(printf '%s\n' "${plot_cmds[@]}")
unset multiplot"
finish
