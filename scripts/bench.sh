#!/usr/bin/env bash
# Benchmarks, each printing a table:   scripts/bench.sh noop | rollout | serve | all
# Short runs: BENCH_RUNS (noop, default 5), BENCH_ROLLOUTS (rollout, default 10),
# BENCH_ROUNDS (serve, default 5). Each benchmark has its own container label, proxy names,
# compose project and ports, and removes its containers and directories when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
case "$which" in
  noop|rollout|serve|all) ;;
  *) echo "usage: scripts/bench.sh noop|rollout|serve|all" >&2; exit 2 ;;
esac
need() {  # need COMMAND PACKAGE
  command -v "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$2"; }
}
case "$which" in noop|rollout|all) need docker-compose docker-compose ;; esac
case "$which" in rollout|all) need wrk wrk ;; esac
scripts/test-images.sh >/dev/null
cargo build --release --quiet
case "$which" in
  noop) python3 bench/noop.py ;;
  rollout) python3 bench/rollout.py ;;
  serve) python3 bench/serve.py ;;
  all) python3 bench/noop.py; python3 bench/rollout.py; python3 bench/serve.py ;;
esac
