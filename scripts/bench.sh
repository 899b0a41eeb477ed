#!/usr/bin/env bash
# Benchmarks, each printing its tables:   scripts/bench.sh noop | rollout | serve | swarm | all
# Short runs: BENCH_RUNS (noop, default 5), BENCH_ROLLOUTS (rollout, default 10),
# BENCH_ROUNDS (serve, default 5), BENCH_UPDATES (swarm, default 4). `swarm` makes a single-node
# Swarm when the engine is in none (and leaves it); the release berth is its own agent (it is
# statically linked). Each benchmark has its own container label, proxy names,
# compose project and ports, and removes its containers and directories when it ends; traffic
# goes to 127.0.0.1 only.
# Each run's raw output, headed by the commit, the date and the tool versions, is written to
# bench/results/<name>.txt (BENCH_RESULTS=DIR elsewhere): docs/benchmarks.md quotes those files.
# On a shared host, run it under the Docker lock: flock -o /tmp/berth-docker.lock scripts/bench.sh noop
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
case "$which" in
  noop|rollout|serve|swarm|all) ;;
  *) echo "usage: scripts/bench.sh noop|rollout|serve|swarm|all" >&2; exit 2 ;;
esac
need() {  # need COMMAND PACKAGE
  command -v "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$2"; }
}
case "$which" in noop|rollout|all) need docker-compose docker-compose ;; esac
case "$which" in rollout|swarm|all) need wrk wrk ;; esac
need curl curl
scripts/test-images.sh >/dev/null
cargo build --release --quiet --bin berth
# Static builds name the host's target (.cargo/config.toml), so the binary is under its triple.
berth_bin=${BERTH_BIN:-${CARGO_TARGET_DIR:-target}/$(rustc -vV | sed -n 's/^host: //p')/release/berth}
export BERTH_BIN=$berth_bin
results=${BENCH_RESULTS:-bench/results}
mkdir -p "$results"

header() {  # header NAME
  local dirty=""
  git diff --quiet HEAD -- src templates bench scripts Cargo.toml ':!bench/results' || dirty=" (with uncommitted changes)"
  echo "# scripts/bench.sh $1"
  echo "date:           $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit:         $(git rev-parse HEAD)$dirty"
  echo "berth:          $("$berth_bin" --version) ($berth_bin)"
  echo "docker:         $(docker version --format 'engine {{.Server.Version}}, client {{.Client.Version}}')"
  echo "docker-compose: $(docker-compose version --short) (Debian package, Python $(python3 -c 'import platform; print(platform.python_version())'))"
  echo "wrk:            $(command -v wrk >/dev/null && wrk -v 2>&1 | head -n1 | cut -d' ' -f1-2 || echo 'not installed (not used by this benchmark)')"
  echo "envoy:          $(for v in 1.39.3 1.40.0; do docker run --rm --network none "berth/envoy:$v" --version \
                            | grep -o 'version: [^ ]*' | head -n1 | sed "s|^|berth/envoy:$v |"; done | paste -sd';' -)"
  echo "host:           $(uname -sr), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "load:           $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-minute load average at the start)"
  echo "note:           one modest run; other work on the host adds noise: compare the two sides"
  echo "                of one run, not runs with each other."
}

run() {  # run NAME
  local out="$results/$1.txt"
  { header "$1"; python3 "bench/$1.py"; } | tee "$out.tmp"
  mv "$out.tmp" "$out"
  echo "(written to $out)"
}

case "$which" in
  all) run noop; run rollout; run serve ;;
  *) run "$which" ;;
esac
