#!/usr/bin/env bash
# Builds the statically linked berth binary that runs as `berth agent` inside Envoy images
# (scratch, distroless, Debian alike) and prints its path on stdout.
#
#   scripts/agent-binary.sh            -> target/agent/x86_64-unknown-linux-gnu/agent/berth
#
# Only the gnu target exists here (no musl), so the binary links glibc statically
# (`-C target-feature=+crt-static`). The explicit --target keeps build scripts and proc-macros
# dynamically linked (RUSTFLAGS then apply to the target's crates only), and the separate target
# directory keeps the workspace's ordinary builds untouched: nothing else becomes static.
# Profile `agent` (Cargo.toml): optimised lightly, stripped. Incremental: quick when unchanged.
#
# berth finds the binary at run time as its own executable when that is static, else through
# BERTH_AGENT_BINARY (export BERTH_AGENT_BINARY="$(scripts/agent-binary.sh)").
set -euo pipefail
cd "$(dirname "$0")/.."
triple=x86_64-unknown-linux-gnu
dir=target/agent
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --quiet --bin berth --target "$triple" --profile agent --target-dir "$dir" >&2
bin="$PWD/$dir/$triple/agent/berth"
if ldd "$bin" >/dev/null 2>&1 && ! ldd "$bin" 2>&1 | grep -q 'statically linked'; then
  echo "error: $bin is not statically linked:" >&2
  ldd "$bin" >&2
  exit 1
fi
echo "$bin"
