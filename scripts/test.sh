#!/usr/bin/env bash
# Runs the whole test suite: pure unit tests, golden files, the hostile-config corpus, and the
# integration tests against the real Docker engine and real Envoy images.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/envoy-image.sh 1.39.3 1.40.0 >/dev/null
cargo test --all-targets "$@"
