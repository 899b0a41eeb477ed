#!/usr/bin/env bash
# Copies the Envoy API protos that berth's build script compiles (envoy.config.bootstrap.v3.Bootstrap
# and every file it imports) from the envoy-types crate into proto/envoy-api/, so a build of berth
# needs neither envoy-types nor any network. envoy-types is a dev-dependency (the tests' xDS
# server speaks its types); tests/vendored_protos.rs fails when the copies differ from the
# envoy-types version in Cargo.lock, so run this after bumping it.
#
#   scripts/vendor-envoy-protos.sh
#
# google/protobuf/*.proto are not copied: protox has them built in.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(cargo metadata --format-version 1 | python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
pkg = next(p for p in meta["packages"] if p["name"] == "envoy-types")
print(os.path.join(os.path.dirname(pkg["manifest_path"]), "proto"))
')
rm -rf proto/envoy-api
python3 - "$root" proto/envoy-api <<'PY'
import os, re, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
roots = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
todo, seen = ["envoy/config/bootstrap/v3/bootstrap.proto"], set()
while todo:
    f = todo.pop()
    if f in seen or f.startswith("google/protobuf/"):
        continue
    seen.add(f)
    root = next((r for r in roots if os.path.isfile(os.path.join(src, r, f))), None)
    if root is None:
        sys.exit(f"{f}: in none of {roots}")
    path = os.path.join(src, root, f)
    os.makedirs(os.path.dirname(os.path.join(dst, root, f)), exist_ok=True)
    shutil.copyfile(path, os.path.join(dst, root, f))
    todo += re.findall(r'^import\s+(?:public\s+)?"([^"]+)";', open(path).read(), re.M)
print(f"{len(seen)} files from {src}", file=sys.stderr)
PY
version=$(cargo metadata --format-version 1 | python3 -c '
import json, sys
print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "envoy-types"))')
cat >proto/envoy-api/README.md <<MD
# Envoy API protos (vendored)

The files \`build.rs\` compiles into the descriptors of \`envoy.config.bootstrap.v3.Bootstrap\`
(berth merges a user's bootstrap into its own with protobuf semantics), copied by
\`scripts/vendor-envoy-protos.sh\` from the \`envoy-types\` crate $version, which ships them
unchanged from their upstream repositories, under the Apache License 2.0:

- \`data-plane-api/\`: https://github.com/envoyproxy/data-plane-api
- \`xds/\`: https://github.com/cncf/xds
- \`protoc-gen-validate/\`: https://github.com/bufbuild/protoc-gen-validate

Do not edit them: bump envoy-types and run the script (tests/vendored_protos.rs compares them).
MD
echo "proto/envoy-api: $(find proto/envoy-api -name '*.proto' | wc -l) files from envoy-types $version"
