#!/usr/bin/env bash
# The lowest versions pyproject.toml allows (.ci/minimum-versions.txt), in an environment of
# their own over this machine's torch: a whole small pipeline run through the entry point with
# every report format, help and usage errors, the LLM backbone's tests and the timm and
# hf_image backbones' tests (about 5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
low="$(mktemp -d)/venv"
python -m venv --system-site-packages "$low"
"$low/bin/python" -m pip install -q -r .ci/minimum-versions.txt
"$low/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
PATH="$low/bin:$PATH" "$low/bin/python" -m pytest -q -p no:cacheprovider -n 0 \
  tests/test_llm.py tests/test_dependencies.py \
  tests/test_cli_conventions.py tests/test_library_backbones.py \
  -k "llm or dependencies or names_itself or help_version or every_format_parses or args0 or args3 \
or timm or hf"
