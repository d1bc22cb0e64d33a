#!/usr/bin/env bash
# Installs a real Helm for the chart tests: the PyPI package helm-python-sdk
# (Helm's Go SDK as a shared library behind a ctypes binding; no helm
# binary, no Go toolchain) in a virtualenv under the cargo target directory,
# where the test harness (crates/e2e/src/helm.rs) looks for it. Idempotent:
# a finished venv (its marker file) is left as it is.
#
#   tests/helm/venv.sh            # then: DRA_HELM_TESTS_REQUIRED=1 cargo test
set -euo pipefail
cd "$(dirname "$0")/../.."

# Kept equal to dra_e2e::helm::HELM_PYTHON_SDK_VERSION (a unit test checks).
HELM_PYTHON_SDK_VERSION=0.2.2

target="${CARGO_TARGET_DIR:-target}"
venv="$target/helm-venv"
marker="$venv/.helm-python-sdk-$HELM_PYTHON_SDK_VERSION.ok"
if [ -f "$marker" ] && [ -x "$venv/bin/python" ]; then
  echo "helm-venv: ready ($venv)"
  exit 0
fi

python="${PYTHON3:-}"
if [ -z "$python" ]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
      python=$candidate
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "helm-venv: needs Python >= 3.10 (set PYTHON3)" >&2
  exit 1
fi

rm -rf "$venv"
mkdir -p "$target"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
  --progress-bar off --retries 2 --timeout 30 "helm-python-sdk==$HELM_PYTHON_SDK_VERSION"
# The import loads libhelm_c.so: catches a wheel whose library cannot load
# here (e.g. too old a glibc).
sdk=$("$venv/bin/python" -c 'import helm_python as h; print(h.helm_sdk_version())')
printf 'helm-python-sdk %s\nhelm sdk %s\n' "$HELM_PYTHON_SDK_VERSION" "$sdk" >"$marker"
echo "helm-venv: ready (Helm SDK $sdk, $venv)"
