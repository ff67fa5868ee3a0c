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

plot_cmds=()
panel=0
for preset in "${PRESETS[@]}"; do
  panel=$((panel + 1))
  key="${preset//[^A-Za-z0-9]/_}"
  common=(sim --preset "$preset" --arrival "${ARRIVAL[$preset]}"
    --session-duration "${LIFETIME[$preset]}" --admission "${ADMISSION[$preset]}"
    --duration "${DURATION[$preset]}" --mute-after "$MUTE_AFTER")
  {
    echo "**$preset**: arrivals \`${ARRIVAL[$preset]}\`, lifetimes \`${LIFETIME[$preset]}\` s," \
      "admission \`${ADMISSION[$preset]}\`, ${DURATION[$preset]} s per run, $SEEDS seeds"
    echo
    echo "| seed | full: collapsed | first starved (s) | starved % | mute alarms | KV peak | window: collapsed | first starved (s) | starved % | mute alarms | KV peak |"
    echo "| ---: | :---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: |"
  } >>"$MD"
  declare -A n_collapsed=([full]=0 [window]=0) n_severe=([full]=0 [window]=0)
  rejected_total=0
  full_collapsed_files=()
  full_survived_files=()
  window_files=()
  for ((i = 0; i < SEEDS; i++)); do
    seed=$((SEED_FIRST + i))
    record_seed "$preset" "$seed"
    row="| $seed"
    for kv in full window; do
      csv="$DATA/${key}_${kv}_seed${seed}.csv"
      s=$(summary "${common[@]}" --kv "$kv" --seed "$seed" --timeseries-out "$csv")
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
    progress "$preset seed $seed: full ${n_collapsed[full]} collapsed so far, window ${n_collapsed[window]}"
  done
  {
    echo
    echo "collapses ($preset): full ${n_collapsed[full]}/$SEEDS, window ${n_collapsed[window]}/$SEEDS" \
      "(severe: full ${n_severe[full]}/$SEEDS, window ${n_severe[window]}/$SEEDS);" \
      "sessions rejected by admission over all $((2 * SEEDS)) runs: $rejected_total"
    echo
  } >>"$MD"
  progress "$preset: collapses full ${n_collapsed[full]}/$SEEDS, window ${n_collapsed[window]}/$SEEDS"

  # One panel per preset: KV occupancy (column 4) over time (column 1), one line per run; full KV
  # in reds (dark: collapsed, light: survived), window KV in blues.
  items=()
  first_item=1
  add_items() { # COLOUR TITLE FILES...
    local colour="$1" title="$2" f t
    shift 2
    for f in "$@"; do
      if ((first_item)); then t="title \"$title\""; else t="notitle"; fi
      [ "$title" = "" ] && t="notitle"
      items+=("\"$f\" every ::1 using 1:4 with lines lw 0.8 lc rgb \"$colour\" $t")
      title=""
    done
  }
  add_items "#F4A582" "full KV, survived (${#full_survived_files[@]})" "${full_survived_files[@]}"
  add_items "#B2182B" "full KV, collapsed (${#full_collapsed_files[@]})" "${full_collapsed_files[@]}"
  add_items "#2166AC" "window KV (${n_collapsed[window]}/${#window_files[@]} collapsed)" "${window_files[@]}"
  plot_cmds+=("set title \"$preset: ${ARRIVAL[$preset]}, lifetimes ${LIFETIME[$preset]} s, ${ADMISSION[$preset]}; collapses: full ${n_collapsed[full]}/$SEEDS, window ${n_collapsed[window]}/$SEEDS\"
set xrange [0:${DURATION[$preset]}]
plot $(IFS=,; echo "${items[*]}")")
  unset n_collapsed n_severe
done

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
