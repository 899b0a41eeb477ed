#!/usr/bin/env bash
# Benchmarks, each printing its tables:
#   scripts/bench.sh noop | rollout | serve | swarm | first_build | all
# Short runs: BENCH_RUNS (noop, default 5), BENCH_ROLLOUTS (rollout, default 10),
# BENCH_ROUNDS (serve, default 5), BENCH_UPDATES (swarm, default 4). `swarm` runs on a
# single-node Swarm of the tests' harness (scripts/test-swarm.sh hold 1: under the Swarm lock,
# left afterwards); the release berth is its own agent (it is statically linked). Each benchmark has its own container label, proxy names,
# compose project and ports, and removes its containers and directories when it ends; traffic
# goes to 127.0.0.1 only. `first_build` times `cargo build --release --timings` of a clean
# clone of HEAD in a fresh target directory (cargo's report beside the results).
# Each run's raw output is written to bench/results/<name>.txt (BENCH_RESULTS=DIR elsewhere)
# by the benchmark itself, between a header (the commit and whether the tree differed from it,
# the date, the tool versions, the host, the load average at the start: bench/common.py) and a
# footer (the load average at the end, the wall time); docs/benchmarks.md quotes only those
# committed files, naming their commit. Nobody edits them by hand: rerun instead.
# The figures want a quiet host (the load averages say how quiet it was).
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
case "$which" in
  noop|rollout|serve|swarm|first_build|all) ;;
  *) echo "usage: scripts/bench.sh noop|rollout|serve|swarm|first_build|all" >&2; exit 2 ;;
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

run() {  # run NAME
  local out="$results/$1.txt"
  python3 "bench/$1.py" | tee "$out.tmp"
  mv "$out.tmp" "$out"
  echo "(written to $out)"
}

case "$which" in
  all) run noop; run rollout; run serve; run swarm; run first_build ;;
  *) run "$which" ;;
esac
