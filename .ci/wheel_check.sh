#!/usr/bin/env bash
# etn as a user installs it: the wheel built from this tree, installed without its dependencies
# into a folder of its own put first on the path of this interpreter (whose packages give the
# dependencies), then, from an empty folder outside the clone, `etn ls pipelines` and a dry run
# of the shipped digits pipeline by its name. The package imported there must be the wheel's: an
# editable install of etn beside the dependencies (its import finder) must not answer instead
# (about half a minute).
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
python -m pip install -q --no-deps --target "$work/site" "$work"/wheel/etn_cli-*.whl
export PYTHONPATH="$work/site"
cd "$work/empty"
imported="$(python -c 'import etn_cli; print(etn_cli.__file__)')"
echo "etn_cli imported from $imported"
case "$imported" in
  "$work/site/"*) ;;
  *) echo "error: etn_cli is imported from $imported, not from the wheel in $work/site" >&2
     exit 1 ;;
esac
"$work/site/bin/etn" ls pipelines
"$work/site/bin/etn" run digits --dry-run -d "$work/data" | tail -n 1
echo "wheel check: ok"
