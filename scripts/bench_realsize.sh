#!/usr/bin/env bash
# Real-size benchmark (not in CI: minutes and gigabytes): writes random-weight Q4_K_M GGUFs in the
# shapes of real Qwen3 models with `metronome synth-gguf`, then measures the engine
# (`metronome bench-decode`) and llama.cpp (llama-batched-bench, built outside the repository) on
# the same files: decode tok/s at 1 and 8 sessions, prefill tok/s, peak resident memory, and the
# decode roofline fraction (the bytes one decode step must read / the bandwidth bench-decode
# measures in the same run).
#
# Usage: scripts/bench_realsize.sh [DIR] [SHAPE...]
#   DIR     where the files go (default /tmp); an existing file of the right name is reused
#   SHAPE   synthetic presets (default: qwen3moe-mid qwen3-8b); e.g. qwen3-30b-a3b
# Environment:
#   METRONOME   the engine binary (default build/release/apps/metronome)
#   LLAMA_BIN   llama.cpp's bin directory (default /work/peer/llama.cpp/build/bin); build the tool
#               with `cmake --build <llama.cpp>/build --target llama-batched-bench`
#   THREADS     threads for both engines (default: nproc)
#   DECODE1_ONLY=1  measure decode at 1 session only (for a file close to the machine's memory)
#   CONTEXT / STEPS  prompt tokens per session / measured decode steps (default 128 / 32)
#
# llama.cpp runs with --no-repack (use_extra_bufts = false: its plain CPU kernels), because the
# AMX extra buffer type of a -march=native build faults on a CPU that reports AMX but whose
# kernel or hypervisor does not grant the tile state; on other machines drop it (NO_REPACK=0).
#
# Output: one table row per shape and engine on stdout, raw logs in DIR/bench_realsize_logs/.
set -euo pipefail
dir="${1:-/tmp}"
shift || true
shapes=("$@")
[ "${#shapes[@]}" -gt 0 ] || shapes=(qwen3moe-mid qwen3-8b)
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${METRONOME:-$root/build/release/apps/metronome}"
llama_bin="${LLAMA_BIN:-/work/peer/llama.cpp/build/bin}"
threads="${THREADS:-$(nproc)}"
context="${CONTEXT:-128}"
steps="${STEPS:-32}"
no_repack=()
[ "${NO_REPACK:-1}" = 1 ] && no_repack=(--no-repack)
logs="$dir/bench_realsize_logs"
mkdir -p "$logs"
[ -x "$bin" ] || { echo "no engine binary at $bin (build it or set METRONOME)" >&2; exit 2; }
[ -x "$llama_bin/llama-batched-bench" ] || {
  echo "no llama-batched-bench in $llama_bin (set LLAMA_BIN)" >&2
  exit 2
}

# field FILE REGEX: the first capture group of the first line matching REGEX (sed -E syntax).
field() { sed -nE "s/$2/\1/p" "$1" | head -1; }

# The bytes one decode step of N sessions must read (weights only; the KV read is small at this
# context): every non-expert matrix, one row of token_embd per token, and the experts a step
# selects, estimated for uniform routing (E * (1 - (1 - k/E)^N) distinct experts of E per layer).
step_bytes() {  # step_bytes FILE N
  "$bin" info --model "$1" --json | python3 -c '
import json, sys
d = json.load(sys.stdin); n = int(sys.argv[1]); c = d["config"]
e, k = c.get("num_experts", 0), c.get("num_experts_used", 0)
frac = 1 - (1 - k / e) ** n if e else 0
total = 0.0
for t in d["tensors"]:
    if t["name"] == "token_embd.weight":
        total += n * t["bytes"] / t["shape"][1]
    elif "_exps." in t["name"]:
        total += frac * t["bytes"]
    else:
        total += t["bytes"]
print(int(total))' "$2"
}

# The roofline fraction: TOK_S tokens/s over the rate the bandwidth allows, BW_GBPS / BYTES (one
# step's read) steps a second of N tokens each.
roof() {  # roof TOK_S BYTES BW_GBPS N
  python3 -c "import sys; t, b, bw, n = map(float, sys.argv[1:]); \
print(f'{t / (bw * 1e9 / b * n):.2f}')" "$@"
}

printf '%-14s %-9s %6s %9s %9s %9s %8s %8s %8s %8s\n' shape engine thr "dec1 t/s" "dec8 t/s" \
  "pp t/s" "rss GiB" "file GiB" "roof1" "roof8"
for shape in "${shapes[@]}"; do
  file="$dir/$shape-q4_k_m.gguf"
  if [ ! -s "$file" ]; then
    "$bin" synth-gguf --shape "$shape" --type q4_k_m --out "$file" >"$logs/$shape.synth" 2>&1
  fi
  file_gib="$(python3 -c "import os,sys; print(f'{os.path.getsize(sys.argv[1]) / 2**30:.2f}')" "$file")"
  sessions=(1 8)
  [ "${DECODE1_ONLY:-0}" = 1 ] && sessions=(1)

  # --- the engine ---
  # bw[N]: the read bandwidth the engine's run at N sessions probed, the roofs' denominator for
  # both engines at N.
  declare -A dec=() roofs=() bw=()
  pp="" rss=""
  for n in "${sessions[@]}"; do
    log="$logs/$shape.engine.s$n"
    "$bin" bench-decode --model "$file" --sessions "$n" --context "$context" --steps "$steps" \
      --threads "$threads" >"$log" 2>&1
    dec[$n]="$(field "$log" '^decode tokens\/s ([0-9.]+)$')"
    bw[$n]="$(field "$log" '^read bandwidth GB\/s ([0-9.]+).*')"
    roofs[$n]="$(roof "${dec[$n]}" "$(step_bytes "$file" "$n")" "${bw[$n]}" "$n")"
    if [ "$n" = 1 ]; then
      pp="$(field "$log" '^prefill tokens [0-9]+ in [0-9.]+ s \(([0-9.]+) tok\/s\)')"
    fi
    hwm="$(field "$log" '.*VmHWM ([0-9.]+) GiB.*')"
    rss="$(python3 -c "import sys; print(f'{max(float(x) for x in sys.argv[1:] if x):.2f}')" \
      "$rss" "$hwm")"
  done
  printf '%-14s %-9s %6s %9s %9s %9s %8s %8s %8s %8s\n' "$shape" metronome "$threads" \
    "${dec[1]}" "${dec[8]:--}" "$pp" "$rss" "$file_gib" "${roofs[1]}" "${roofs[8]:--}"

  # --- llama.cpp: one run, 1 and 8 parallel sequences, prefill of $context tokens each ---
  log="$logs/$shape.llama"
  npl="$(IFS=,; echo "${sessions[*]}")"
  /usr/bin/time -v "$llama_bin/llama-batched-bench" -m "$file" -c $(((context + steps) * 8 + 64)) \
    -b 512 -ub 512 -npp "$context" -ntg "$steps" -npl "$npl" -t "$threads" "${no_repack[@]}" \
    >"$log" 2>&1
  # Rows: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...
  row() { awk -F'|' -v b="$1" '$4 + 0 == b && $2 ~ /[0-9]/ {print $'"$2"' + 0; exit}' "$log"; }
  l_dec1="$(row 1 9)"
  l_dec8="$([ "${#sessions[@]}" = 2 ] && row 8 9 || echo -)"
  l_pp="$(row 1 7)"
  l_rss="$(awk '/Maximum resident set size/ {printf "%.2f", $NF / 2^20}' "$log")"
  l_roof1="$(roof "$l_dec1" "$(step_bytes "$file" 1)" "${bw[1]}" 1)"
  l_roof8="-"
  if [ "$l_dec8" != - ]; then
    l_roof8="$(roof "$l_dec8" "$(step_bytes "$file" 8)" "${bw[8]}" 8)"
  fi
  printf '%-14s %-9s %6s %9s %9s %9s %8s %8s %8s %8s\n' "$shape" llama.cpp "$threads" \
    "$l_dec1" "$l_dec8" "$l_pp" "$l_rss" "$file_gib" "$l_roof1" "$l_roof8"
  echo "  ($shape: bandwidth probed by bench-decode ${bw[1]} GB/s at 1 session," \
    "${bw[8]:--} at 8; 1-session step reads" \
    "$(($(step_bytes "$file" 1) / 1000000)) MB)"
done
