#!/usr/bin/env bash
# Installs everything Metronome needs to build, test and benchmark on Debian 12: Debian's packages,
# then the npm packages, each folder exactly as its package-lock.json says: web/ (the dashboard's
# uPlot, embedded into the binary at build time, and playwright-core for the browser test) and
# deploy/validate/ (the Kubernetes manifests' schema check). Idempotent; run as root (or with sudo
# available). --container adds what scripts/container_test.sh needs (podman, runc, debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
container=0
if [ "${1:-}" = --container ]; then container=1; fi

packages=(
  build-essential cmake ninja-build pkg-config
  clang clang-format clang-tidy libclang-rt-dev libomp-dev  # fuzzing (libFuzzer), format, lint
  libdnnl-dev            # oneDNN: fp32 GEMM with run-time ISA dispatch
  ocl-icd-opencl-dev     # oneDNN's CMake config looks for OpenCL (a Recommends we skip)
  libcli11-dev           # command line
  nlohmann-json3-dev     # JSON (event log, summaries)
  libboost-dev           # Beast/Asio (header-only): the network server
  libssl-dev             # libcrypto's HMAC-SHA256: the cluster seal of resume tokens
  libgtest-dev libbenchmark-dev
  nodejs npm chromium    # the dashboard: npm ci (uPlot, playwright-core) and its browser test
  gnuplot-nox            # the evaluation suite's plots (experiments/eval)
  python3                # tests/redteam: the red team's WebSocket client (standard library only)
  python3-websockets     # examples/client.py and its test (tests/examples)
  jq curl                # scripts/lib.sh: JSON (summaries, /v1/stats, sim --list-presets --json), HTTP
  haproxy                # scripts/cluster.sh and its test (the balancer in front of the replicas);
                         # scripts/validate_manifests.sh (haproxy -c on deploy/kubernetes' config)
)
if ((container)); then
  packages+=(podman runc debootstrap)  # deploy/README.md, "Containers on this machine"
fi

missing=()
for p in "${packages[@]}"; do
  # A nodejs from elsewhere (e.g. NodeSource) bundles npm and conflicts with Debian's npm package.
  if [ "$p" = npm ] && command -v npm >/dev/null; then continue; fi
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

# The JavaScript packages, exactly as locked. Playwright drives the Debian chromium
# (/usr/bin/chromium); it must not download browsers of its own. A copy of the lock file in
# node_modules records what was installed: when it matches, the install is current.
for prefix in web deploy/validate; do
  stamp=$prefix/node_modules/.metronome-package-lock.json
  if cmp -s "$prefix/package-lock.json" "$stamp"; then
    echo "[setup] $prefix/node_modules up to date"
  else
    echo "[setup] npm ci --prefix $prefix"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix "$prefix" --no-audit --no-fund
    cp "$prefix/package-lock.json" "$stamp"
  fi
done
