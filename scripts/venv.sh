#!/usr/bin/env bash
# Creates .venv/ at the repository root with Python >= 3.11 and installs lowtide into it as an
# editable install whose .pth file puts services/ on sys.path (so the generated lowtide_pb
# package next to lowtide is importable), with the spark and test extras.
# Called by `make setup` only when pyproject.toml changed or .venv is missing or broken.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

ok_python() {  # $1: interpreter; true if it runs and is >= 3.11 and has the venv module
  "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

if [ -x "$venv/bin/python" ] && ok_python "$venv/bin/python"; then
  :
else
  py=""
  for cand in ${PYTHON:-} python3 python3.13 python3.12 python3.11; do
    if command -v "$cand" >/dev/null 2>&1 && ok_python "$cand"; then py=$(command -v "$cand"); break; fi
  done
  if [ -z "$py" ]; then
    found=$(python3 --version 2>&1 || echo "no python3 on PATH")
    echo "setup: ERROR: lowtide needs Python >= 3.11 with the venv module (found: $found)." >&2
    echo "setup:        install python3.11 (Debian: apt-get install python3.11 python3.11-venv)," >&2
    echo "setup:        or point make at one: make setup PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  [ -e "$venv" ] && { echo "setup: .venv is broken or older than Python 3.11: recreating it"; rm -rf "$venv"; }
  echo "setup: creating .venv with $py ($("$py" --version 2>&1))"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi

echo "setup: installing lowtide and its dependencies into .venv (first run downloads PySpark, ~1-3 min)"
cd "$root"
pip_install() { "$venv/bin/python" -m pip install -q --progress-bar off -e '.[spark,test]' "$@"; }
services_on_path() {
  "$venv/bin/python" -c 'import sys; sys.exit(sys.argv[1] not in sys.path)' "$root/services"
}
# With packages only under services/, setuptools' default editable mode writes a .pth file with
# services/ itself (so lowtide_pb, generated after the install, imports too). Should a layout
# change make it install a finder instead, fall back to the 'compat' mode, which always does.
pip_install
if ! services_on_path; then
  echo "setup: services/ not on sys.path after the editable install; reinstalling in compat mode"
  pip_install --config-settings editable_mode=compat
  services_on_path || { echo "setup: ERROR: services/ is not on .venv's sys.path" >&2; exit 1; }
fi
