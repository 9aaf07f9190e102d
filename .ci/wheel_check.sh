#!/usr/bin/env bash
# etn as a user installs it: the wheel built from this tree, installed without its dependencies
# into a fresh environment over this machine's packages, then, from an empty folder outside the
# clone, `etn ls pipelines` and a dry run of the shipped digits pipeline by its name. The
# package imported there must be the wheel's: an editable install of etn in the system
# site-packages (its import finder) must not answer instead (about half a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH  # a clone's etn_cli on the path would hide the wheel's
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# a copy of the sources, so that no stale build/ folder of this clone adds a file to the wheel
mkdir "$work/source" "$work/empty"
cp pyproject.toml README.md "$work/source/"
cp -r etn_cli "$work/source/"
find "$work/source" \( -name __pycache__ -o -name 'my_*' -o -name model.safetensors \) \
  -prune -exec rm -rf {} +
python -m pip wheel -q --no-deps --no-build-isolation -w "$work/wheel" "$work/source"
python -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-deps "$work"/wheel/etn_cli-*.whl
cd "$work/empty"
imported="$("$work/venv/bin/python" -c 'import etn_cli; print(etn_cli.__file__)')"
echo "etn_cli imported from $imported"
case "$imported" in
  "$work/venv/"*) ;;
  *) echo "error: the venv imports etn_cli from $imported, not from the wheel in $work/venv" >&2
     exit 1 ;;
esac
"$work/venv/bin/etn" ls pipelines
"$work/venv/bin/etn" run digits --dry-run -d "$work/data" | tail -n 1
echo "wheel check: ok"
