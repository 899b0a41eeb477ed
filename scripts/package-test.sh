#!/usr/bin/env bash
# The package job (.ci/run): builds berth's Debian package (scripts/package-deb.sh), installs it
# with dpkg -i on this machine and checks what an operator gets: `berth version` from
# /usr/bin/berth, the systemd unit (systemd-analyze verify; systemd need not be PID 1), the
# completions and manual pages; then starts a small fleet with the installed berth, removes the
# package (dpkg -r) and checks the replicas still serve. Cleans up by label, also on failure,
# and leaves the package uninstalled (or as it found it: an installed berth package is refused).
#
#   scripts/package-test.sh            BERTH_BIN: the binary to package (CI: the test build's,
#                                      already built; default: the release build)
# Needs root, Docker and the image berth-test/envoy:1.40.0 (scripts/test-images.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/host-sysctls.sh
start=$SECONDS
label=io.berth.test.package=$$
work=$(mktemp -d /tmp/berth-package-test.XXXXXX)
# Installed, or removed with its configuration kept (dpkg -r): dpkg knows it.
known() { [ -n "$(dpkg-query -W -f '${db:Status-Status}' berth 2>/dev/null | grep -v '^not-installed$')" ]; }
fail() { echo "package test: FAILED: $*" >&2; exit 1; }
ok() { echo "  ok: $*"; }
finish() {
  local ids
  ids=$(docker ps -aq --filter "label=$label")
  [ -z "$ids" ] || docker rm -f -v $ids >/dev/null
  if [ -n "${installed_here:-}" ] && known; then dpkg -P berth >/dev/null; fi
  restore_host_sysctls
  rm -rf "$work"
}
trap finish EXIT

[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i)"
if known; then
  fail "a berth package is on this machine already ($(dpkg-query -W -f '${Version} ${db:Status-Status}' berth)); remove it first: dpkg -P berth"
fi

echo "building the package"
deb=$(scripts/package-deb.sh "$work/out" | tail -n1)
echo "  $deb ($(du -h "$deb" | cut -f1))"
dpkg-deb --contents "$deb" | awk '{ print $6 }' >"$work/contents"
for path in ./usr/bin/berth ./lib/systemd/system/berth.service ./usr/share/man/man1/berth.1.gz \
  ./usr/share/man/man1/berth-up.1.gz ./usr/share/bash-completion/completions/berth \
  ./usr/share/zsh/vendor-completions/_berth ./usr/share/fish/vendor_completions.d/berth.fish \
  ./usr/share/doc/berth/README.md ./usr/share/doc/berth/docs/configuration.md \
  ./usr/share/doc/berth/examples/quickstart.toml ./usr/share/doc/berth/copyright; do
  grep -qxF "$path" "$work/contents" || fail "$path is not in the package"
done
ok "contents ($(wc -l <"$work/contents") paths)"

echo "dpkg -i"
installed_here=1
dpkg -i "$deb" >/dev/null
[ "$(command -v berth)" = /usr/bin/berth ] || fail "berth on PATH is $(command -v berth), not /usr/bin/berth"
version=$(/usr/bin/berth version)
# The commit the packaged binary was built from (BERTH_EXPECT_COMMIT: when it is not HEAD).
commit=${BERTH_EXPECT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
grep -q "^berth $(dpkg-query -W -f '${Version}' berth)\$" <<<"$version" || fail "berth version says: $version"
printed=$(sed -n 's/^commit: *\([0-9a-f]*\).*/\1/p' <<<"$version")
[ -n "$printed" ] && [[ $commit == "$printed"* ]] || fail "berth version names another commit than $commit: $version"
ok "berth version: $(head -n1 <<<"$version"), commit ${commit:0:12}"

# systemd-analyze verify loads the unit and what it names (ExecStart's binary, the targets);
# docker.service is only wanted, so a host without it passes.
verify=$(systemd-analyze verify /lib/systemd/system/berth.service 2>&1) || fail "systemd-analyze verify: $verify"
if grep -v "docker.service" <<<"$verify" | grep -q .; then fail "systemd-analyze verify warns: $verify"; fi
grep -q '^ExecStart=/usr/bin/berth -f /etc/berth/berth.toml serve$' /lib/systemd/system/berth.service ||
  fail "the unit does not run /usr/bin/berth serve on /etc/berth/berth.toml"
ok "systemd-analyze verify berth.service"

# Completions: each shell's script names the commands (bash: it registers itself).
bash -c 'source /usr/share/bash-completion/completions/berth && complete -p berth' >/dev/null ||
  fail "the bash completion does not register for berth"
for f in /usr/share/zsh/vendor-completions/_berth /usr/share/fish/vendor_completions.d/berth.fish; do
  grep -q 'completions' "$f" && grep -q 'serve' "$f" || fail "$f does not know berth's commands"
done
# Manual pages: one per command, each a roff page whose title is its name.
for cmd in $(/usr/bin/berth --help | awk '/^Commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { exit }'); do
  [ "$cmd" = help ] && continue
  page=/usr/share/man/man1/berth-$cmd.1.gz
  zcat "$page" 2>/dev/null | grep -q "^\.TH berth-$cmd 1" || fail "no manual page $page"
done
zcat /usr/share/man/man1/berth.1.gz | grep -q '^\.TH berth 1' || fail "berth.1 is not berth's page"
ok "completions (bash, zsh, fish) and manual pages ($(ls /usr/share/man/man1/berth*.1.gz | wc -l))"

echo "a fleet from the installed berth survives removing the package"
port=$(shuf -i 20000-29999 -n 1)
while ss -Hltn "sport = :$port" | grep -q .; do port=$(shuf -i 20000-29999 -n 1); done
cat >"$work/berth.toml" <<EOF
[[proxy]]
name = "pkgtest$$"
image = "berth-test/envoy:1.40.0"
replicas = 2

[[proxy.listener]]
name = "web"
port = $port
protocol = "http"

[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 200, body = "served by the packaged berth\n" }
EOF
export BERTH_SYSCTL_DROPIN=/tmp/berth-test-sysctl.d/60-berth.conf
/usr/bin/berth -f "$work/berth.toml" --state-dir "$work/state" \
  --container-label io.berth.test=1 --container-label "$label" up >"$work/up.log" 2>&1 ||
  fail "berth up: $(cat "$work/up.log")"
[ "$(docker ps -q --filter "label=$label" | wc -l)" = 2 ] || fail "not 2 replicas running"
body=$(curl -sS --max-time 5 "http://127.0.0.1:$port/") || fail "no answer on 127.0.0.1:$port"
[ "$body" = "served by the packaged berth" ] || fail "127.0.0.1:$port answered: $body"
dpkg -r berth >/dev/null
[ ! -e /usr/bin/berth ] || fail "/usr/bin/berth is still there after dpkg -r"
[ ! -e /lib/systemd/system/berth.service ] || fail "the unit is still there after dpkg -r"
for i in 1 2 3 4 5 6 7 8 9 10; do
  body=$(curl -sS --max-time 5 "http://127.0.0.1:$port/") || fail "request $i after dpkg -r: no answer"
  [ "$body" = "served by the packaged berth" ] || fail "request $i after dpkg -r answered: $body"
done
[ "$(docker ps -q --filter "label=$label" | wc -l)" = 2 ] || fail "not 2 replicas running after dpkg -r"
ok "dpkg -r: /usr/bin/berth gone, 2 replicas still serve 127.0.0.1:$port (10 of 10 requests)"
dpkg -P berth >/dev/null
echo "package test passed in $((SECONDS - start)) s"
