#!/usr/bin/env bash
# Installs everything Metronome needs to build, test and benchmark on Debian 12, from Debian's
# packages only. Idempotent; run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  clang clang-format clang-tidy libclang-rt-dev libomp-dev  # fuzzing (libFuzzer), format, lint
  libdnnl-dev            # oneDNN: fp32 GEMM with run-time ISA dispatch
  libcli11-dev           # command line
  nlohmann-json3-dev     # JSON (event log, summaries)
  libboost-dev           # Beast/Asio (header-only): the network server
  libgtest-dev libbenchmark-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all packages present"
fi
