#!/usr/bin/env bash
# Builds every image the test suite uses; idempotent and quick when they exist.
#   berth-test/envoy:1.39.3, berth-test/envoy:1.40.0   real Envoy (scripts/envoy-image.sh)
#   berth-test/envoy:exits-at-start                    passes `envoy --mode validate`, exits at start
set -euo pipefail
cd "$(dirname "$0")"
./envoy-image.sh 1.39.3 1.40.0
broken=berth-test/envoy:exits-at-start
if ! docker image inspect "$broken" >/dev/null 2>&1; then
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  gcc -static -O2 -o "$ctx/entrypoint" test-image/exits-at-start.c
  printf 'FROM berth-test/envoy:1.40.0\nCOPY entrypoint /usr/local/bin/entrypoint\nENTRYPOINT ["/usr/local/bin/entrypoint"]\n' >"$ctx/Dockerfile"
  docker build --quiet -t "$broken" "$ctx" >/dev/null
  echo "built $broken"
fi
