#!/usr/bin/env bash
# Experiment 09, a mixed population (issue 36): speech (80 ms, 1 token), Omni-like chunks (1 s,
# 25 tokens, a 2048-token prompt) and agent-loop turns (2 s, 64 in / 32 out) arriving far above
# capacity, on the simulator presets and on the real engine (pseudo-preset "cpu"). Compared:
# session-count admission (static:N, N = the budget aimd settles at for uniform speech sessions:
# the count an operator would set from a speech benchmark) and work admission (aimd over work,
# the default). Measured per class: admitted sessions and work, late and starved frames, p99 / D;
# per run: the work admitted over the second half, prompts' prefill included, against the speech
# budget (the schedulable work, in units of speech sessions) and the time the limit first reaches
# 0.9 of its settled value.
source "$(dirname "$0")/common.sh"
eval_init 09_mixed_population "$@"
record_seed "sim and drive (all runs)" "$SEED"
if [ "$CPU" = 1 ]; then PRESETS="$PRESETS cpu"; fi

# base PRESET: the command of a run on PRESET (global array BASE) and its run settings.
base() {
  if [ "$1" = cpu ]; then
    BASE=(drive --model "$CPU_MODEL" --threads 1 --kv window --window "$CPU_WINDOW"
      --kv-blocks "$CPU_BLOCKS")
    run_s=$CPU_RUN_S arrival=$CPU_ARRIVAL lifetime=$CPU_SESSION_DURATION
    crowd=$CPU_BASELINE_CROWD baseline_s=$CPU_BASELINE_RUN_S
  else
    BASE=(sim --preset "$1" --kv window --max-step-tokens "$STEP_TOKENS")
    run_s=$RUN_S arrival=$ARRIVAL lifetime=$SESSION_DURATION
    crowd=$BASELINE_CROWD baseline_s=$BASELINE_RUN_S
  fi
}

: >"$OUT/09_runs.csv"
for preset in $PRESETS; do
  base "$preset"
  f="$OUT/09_${preset}_speech"
  if ! have "$f.json"; then
    progress "$preset: the speech budget (aimd, $crowd speech sessions, ${baseline_s} s)"
    summary "${BASE[@]}" "${REFERENCE[@]}" --admission aimd --seed "$SEED" --sessions "$crowd" \
      --duration "$baseline_s" >"$f.json"
  fi
  n=$(jq -r '.limit_mean_second_half | floor' "$f.json")
  for ctl in "static:$n" aimd; do
    label=work
    if [ "$ctl" != aimd ]; then label=count; fi
    g="$OUT/09_${preset}_$label"
    echo "$preset,$n,$label,$ctl,$run_s" >>"$OUT/09_runs.csv"
    if have "$g.json" "$g.csv"; then continue; fi
    progress "$preset: $ctl over the mix, ${run_s} s"
    summary "${BASE[@]}" "${REFERENCE[@]}" --mix "$MIX" --admission "$ctl" --seed "$SEED" \
      --arrival "$arrival" --session-duration "$lifetime" --duration "$run_s" \
      --timeseries-out "$g.csv" >"$g.json"
  done
done

# first_reach CSV: the first time (s) the active count reaches 0.9 of its mean over the second
# half ("-" if never).
first_reach() {
  awk -F, 'NR > 1 { t[++k] = $1; a[k] = $2 }
    END { half = t[k] / 2; for (i = 1; i <= k; i++) if (t[i] >= half) { s += a[i]; m++ }
      mean = m ? s / m : 0; for (i = 1; i <= k; i++) if (a[i] >= 0.9 * mean) { printf "%.0f\n", t[i]; exit }
      print "-" }' "$1"
}

: >"$OUT/09_data.csv"
{
  echo "The mix \`$MIX\` (shares: relative weights of arrivals), arrivals $ARRIVAL with lifetimes $SESSION_DURATION on the simulator ($RUN_S s, window KV at each preset's window, a $STEP_TOKENS-token step budget), $CPU_ARRIVAL / $CPU_SESSION_DURATION on the CPU engine ($CPU_RUN_S s, real clock), seed $SEED. One unit of work = one 80 ms speech session (\`PriceSession\`). **count**: static:N, N = the budget aimd settles at for uniform speech sessions (its second-half mean limit); **work**: aimd over work. **active work** and **prompt work**: the second half's mean steady work of the live sessions and the prefill of the prompts admitted in it (units; \`PriceSession\`'s prompt_work_s). **waited for own prompt**: frames that arrived before their session's own prompt was in (its start, delayed by its own declaration: \`FrameRecord::behind_own_prompt\`); **late** and **p99 / D** are over the other frames. **work / budget**: (active + prompt work) / N, the schedulable work in speech units. **0.9 reach**: the first time the active sessions reach 0.9 of their second-half mean."
  echo
  echo "| system | admission | class | admitted | active work | prompt work | waited for own prompt | late | starved | p99 / D | work / budget | 0.9 reach (s) |"
  echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  while IFS=, read -r preset n label ctl run_s; do
    g="$OUT/09_${preset}_$label"
    total=$(jq '[.classes[] | .active_work_mean_second_half + .prompt_work_mean_second_half] | add' "$g.json")
    ratio=$(awk -v t="$total" -v n="$n" 'BEGIN { printf "%.2f", t / n }')
    reach=$(first_reach "$g.csv")
    jq -r --arg sys "$(run_label "$preset")" --arg adm "$label ($ctl)" --arg ratio "$ratio" --arg reach "$reach" \
      'def pct(a; b): if b > 0 then (a * 10000 / b | round / 100 | tostring) + "%" else "-" end;
       .classes[] | "| \($sys) | \($adm) | \(.name) | \(.admitted) | \(.active_work_mean_second_half | . * 10 | round / 10) | \(.prompt_work_mean_second_half | . * 10 | round / 10) | \(pct(.own_prompt_frames; .frames)) | \(pct(.late_frames - .own_prompt_late_frames; .frames - .own_prompt_frames)) | \(.starved_frames) | \(if .p99_after_own_prompt_ms == null then "-" else (.p99_after_own_prompt_ms / .deadline_ms * 100 | round / 100 | tostring) end) | \($ratio) | \($reach) |"' "$g.json"
    echo "$preset,$label,$ratio,$reach" >>"$OUT/09_data.csv"
  done <"$OUT/09_runs.csv"
  echo
} >"$OUT/09_mixed_population.md"

# One panel per system: active sessions under each admission, and the count baseline's N.
systems=$(cut -d, -f1 "$OUT/09_runs.csv" | uniq)
nsys=$(wc -l <<<"$systems")
cols=$((nsys < 2 ? nsys : 2))
rows=$(((nsys + cols - 1) / cols))
panels=""
for preset in $systems; do
  n=$(awk -F, -v p="$preset" '$1 == p { print $2; exit }' "$OUT/09_runs.csv")
  panels+="$(time_panel "$(run_label "$preset") (speech budget N = $n)" \
    "'$OUT/09_${preset}_count.csv' every ::1 using 1:2 with lines lw 1.6 lc rgb '#c0392b' title 'count (static:$n): active sessions'" \
    "'$OUT/09_${preset}_work.csv' every ::1 using 1:2 with lines lw 1.6 lc rgb '#2471a3' title 'work (aimd): active sessions'" \
    "'$OUT/09_${preset}_work.csv' every ::1 using 1:3 with lines lw 1 dt 2 lc rgb '#2471a3' title 'work (aimd): budget (units)'")"
done
multiplot_png "$OUT/09_mixed_population.png" $((700 * cols + 100)) $((520 * rows + 60)) "$rows" "$cols" 2 \
  "A mixed population: session-count vs work admission" "$panels"
finish
