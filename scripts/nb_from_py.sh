#!/usr/bin/env bash
# Convert a jupytext percent script into a source notebook without outputs, with a python3 kernelspec.
# usage: scripts/nb_from_py.sh /path/to/NN_name.py   -> notebooks/NN_name.ipynb
set -euo pipefail
src=$1
out="$(dirname "$0")/../notebooks/$(basename "${src%.py}").ipynb"
jupytext --to ipynb --set-kernel python3 -o "$out" "$src" >/dev/null
echo "$out"
