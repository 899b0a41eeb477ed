#!/usr/bin/env bash
# Runs the whole test suite: pure unit tests, golden files, the hostile-config corpus, and the
# integration tests against the real Docker engine and real Envoy images.
set -euo pipefail
cd "$(dirname "$0")/.."
# Puts the sysctls the tests tune back when the suite ends.
source scripts/host-sysctls.sh
trap restore_host_sysctls EXIT
scripts/test-images.sh >/dev/null
cargo test --all-targets "$@"
# The engine-restart test restarts dockerd, so it is ignored unless asked for; CI asks (and it
# fails there when it cannot restart the engine).
if [ -n "${CI:-}" ]; then
  cargo test --test engine_restart -- --ignored
fi
