#!/usr/bin/env bash
# Builds every image the test suite uses; idempotent and quick when they exist.
#   berth-test/envoy:1.39.3, berth-test/envoy:1.40.0   real Envoy (scripts/envoy-image.sh)
#   berth-test/envoy:exits-at-start                    passes `envoy --mode validate`, exits at start
#                                                      (scripts/test-image/)
# Each image carries the label io.berth.image-key, a hash of what builds it (the scripts, the
# Dockerfile, the C source, the base image's ID); one whose key differs is rebuilt.
set -euo pipefail
cd "$(dirname "$0")"
source ./locks.sh
./envoy-image.sh 1.39.3 1.40.0
broken=berth-test/envoy:exits-at-start
key=$({ cat test-images.sh test-image/Dockerfile test-image/exits-at-start.c
        docker image inspect --format '{{.Id}}' berth-test/envoy:1.40.0; } | sha256sum | cut -c1-16)
key_of() { docker image inspect --format '{{index .Config.Labels "io.berth.image-key"}}' "$broken" 2>/dev/null || true; }
[ "$(key_of)" = "$key" ] && exit 0
lock=/tmp/berth-locks/images.lock
exec 8>>"$lock"
take_lock 8 "$lock" "another build of the test images"
[ "$(key_of)" = "$key" ] && exit 0
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
gcc -static -O2 -o "$ctx/entrypoint" test-image/exits-at-start.c
cp test-image/Dockerfile "$ctx/Dockerfile"
docker build --quiet --label "io.berth.image-key=$key" -t "$broken" "$ctx" >/dev/null
echo "built $broken (key $key)"
