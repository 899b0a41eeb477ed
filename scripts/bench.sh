#!/usr/bin/env bash
# Benchmarks, each printing a table:   scripts/bench.sh noop | rollout | serve | all
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
command -v docker-compose >/dev/null || { apt-get update -qq && apt-get install -y -qq docker-compose; }
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
scripts/test-images.sh >/dev/null
cargo build --release --quiet
case "$which" in
  noop) python3 bench/noop.py ;;
  rollout) python3 bench/rollout.py ;;
  serve) python3 bench/serve.py ;;
  all) python3 bench/noop.py; python3 bench/rollout.py; python3 bench/serve.py ;;
  *) echo "usage: scripts/bench.sh noop|rollout|serve|all" >&2; exit 2 ;;
esac
