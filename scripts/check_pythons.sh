#!/usr/bin/env bash
# `make check-pythons`: install the project into a venv of every Python that pyproject.toml promises
# (requires-python) and that pyenv or PATH has, run the fast tests there, and print one PASS/FAIL line each.
#   ROOT=<repo>          the repository (default: the folder above this script)
#   BUILD=build/pythons  where the venvs and logs go (a venv is reused while pyproject.toml is unchanged)
#   PYTHONS="3.10 3.13"  only these (default: every 3.X in requires-python)
#   TORCH=torch==2.13.0  installed first, as `make` does (for Pythons other than the one /opt/wheels serves,
#                        this is PyPI's CUDA build: about 4.5 GB a venv, a minute or two from a near mirror)
#   MARK='not triton and not slow'
# Exit status: 0 when every version found passed, 1 otherwise. Versions not found print SKIP.
set -uo pipefail
cd "${ROOT:-$(dirname "$0")/..}"   # the repository root (this file lives in scripts/)
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build/pythons}
TORCH=${TORCH:-torch==2.13.0}
MARK=${MARK:-not triton and not slow}
PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
mkdir -p "$BUILD"

if [[ -z "${PYTHONS:-}" ]]; then
  # requires-python = ">=3.10,<3.14"  ->  3.10 3.11 3.12 3.13
  spec=$(sed -n 's/^requires-python *= *"\(.*\)"/\1/p' pyproject.toml)
  lo=$(sed -n 's/.*>= *3\.\([0-9]*\).*/\1/p' <<<"$spec")
  hi=$(sed -n 's/.*< *3\.\([0-9]*\).*/\1/p' <<<"$spec")
  PYTHONS=$(for ((m = lo; m < hi; m++)); do printf '3.%d ' "$m"; done)
fi

find_python() {  # the newest interpreter for minor version $1: PATH first (a pyenv shim may refuse), then pyenv's
  local exe
  if exe=$(command -v "python$1") && "$exe" -c '' 2>/dev/null; then echo "$exe"; return; fi
  exe=$(ls -d "$PYENV_ROOT"/versions/"$1".*/bin/"python$1" 2>/dev/null | sort -V | tail -1)
  [[ -n "$exe" && -x "$exe" ]] && echo "$exe"
}

stamp=$(cksum < pyproject.toml | cut -d' ' -f1)
status=0
summary=()
for v in $PYTHONS; do
  py=$(find_python "$v") || true
  if [[ -z "$py" ]]; then summary+=("SKIP $v: no interpreter (pyenv install $v)"); continue; fi
  full=$("$py" -c 'import platform; print(platform.python_version())')
  venv=$BUILD/py$v log=$BUILD/py$v.log
  : > "$log"
  echo "== Python $full: $venv (log: $log)"
  if [[ ! -e $venv/.installed-$stamp ]]; then
    rm -rf "$venv"
    if ! { "$py" -m venv "$venv" &&
           "$venv/bin/python" -m pip install --quiet --upgrade pip &&
           "$venv/bin/python" -m pip install --quiet --no-compile "$TORCH" &&
           "$venv/bin/python" -m pip install --quiet --no-compile -e '.[full,cpu,test]'; } >>"$log" 2>&1; then
      summary+=("FAIL $v ($full): install failed, see $log"); status=1; continue
    fi
    touch "$venv/.installed-$stamp"
  fi
  versions=$("$venv/bin/python" - 2>>"$log" <<'EOF'
from importlib.metadata import PackageNotFoundError, version
def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "-"
print(" ".join(f"{n}={v(n)}" for n in ("numpy", "torch", "onnx", "ml_dtypes", "onnxruntime", "pulp")))
EOF
)
  start=$SECONDS
  "$venv/bin/python" -m pytest -m "$MARK" -q -p no:cacheprovider >>"$log" 2>&1
  rc=$?
  wall=$((SECONDS - start))
  line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|errors|skipped|deselected)|no tests ran' "$log" | tail -1 | sed 's/^=* *//; s/ *=*$//')
  count() { local n; n=$(grep -oE "[0-9]+ $1" <<<"$line" | head -1 | cut -d' ' -f1); echo "${n:-0}"; }
  counts="$(count passed) passed, $(count failed) failed, $(count 'errors?') errors, $(count skipped) skipped"
  if [[ $rc -eq 0 ]]; then verdict=PASS; else verdict=FAIL; status=1; fi
  summary+=("$verdict $v ($full): $counts, ${wall}s (pytest rc $rc) [$versions]")
done

echo
printf '%s\n' "${summary[@]}"
exit $status
