#!/usr/bin/env bash
# One-shot environment set-up used by `make test` / `make book` (idempotent, fast when nothing changed).
#   1. .venv with phantom installed editable plus the extras, torch pinned to the local CPU build;
#   2. Debian's libtcmalloc-minimal4 (the lab's processes preload it, see src/phantom/proc/malloc.py);
#   3. Debian's chromium for the browser test of the rendered book (apt, only when missing; skipped
#      with PHANTOM_SETUP_BROWSER=0, which `make book` sets: building the book needs no browser).
# usage: scripts/setup_env.sh PYTHON VENV EXTRAS
set -euo pipefail
PYTHON=${1:-python3}
VENV=${2:-.venv}
EXTRAS=${3:-dev,lab,verl,trl,book}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STAMP="$VENV/.phantom-installed"
want="$(sha256sum pyproject.toml constraints.txt | sha256sum | cut -c1-16) $EXTRAS $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"

# This machine's pip config names local indexes that may not exist; pip warns per package. Quiet that.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
healthy() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import sys" 2>/dev/null; }
if ! healthy; then
  echo "[setup] creating $VENV with $("$PYTHON" --version)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
# uv resolves and installs the same pinned set ~5x faster than pip (16 s against 80 s for the whole
# environment on the 2-core build machine, identical `pip freeze`); pip stays the fallback wherever uv
# cannot be installed or fails. uv does not read pip's configuration, so the wheel folders pip is told
# about (find-links: the local CPU build of torch) are handed over explicitly.
UV_VERSION=0.13.9
uv_install() {
  local links=() l
  for l in ${PIP_FIND_LINKS:-} $("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true); do
    [ -d "$l" ] && links+=(--find-links "$l")
  done
  quiet "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION" || return 1
  local uv=("$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" "${links[@]}" -c constraints.txt)
  # torch first, from the pinned CPU build, so no other requirement can pull a CUDA wheel.
  "${uv[@]}" "torch==2.13.0" && "${uv[@]}" -e ".[$EXTRAS]"
}
pip_install() {
  quiet "$VENV/bin/python" -m pip install -q --upgrade pip
  quiet "$VENV/bin/python" -m pip install -q -c constraints.txt "torch==2.13.0"
  quiet "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[$EXTRAS]"
}
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  echo "[setup] installing phantom[$EXTRAS] into $VENV (torch==2.13.0, CPU build)"
  if [ "${PHANTOM_SETUP_PIP:-0}" != 1 ] && uv_install; then
    echo "[setup] installed with uv $UV_VERSION"
  else
    echo "[setup] installing with pip"
    pip_install
  fi
  echo "$want" > "$STAMP"
else
  echo "[setup] $VENV is up to date"
fi

if [[ ",$EXTRAS," == *",book,"* ]] && ! command -v npm >/dev/null 2>&1; then
  # scripts/vendor_js.py fetches MathJax, require.js and the widget manager with `npm pack`
  echo "[setup] installing Debian nodejs + npm for vendoring the book's JavaScript"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi

if [[ ",$EXTRAS," == *",lab,"* ]] && [ "$(uname -s)" = Linux ] && command -v apt-get >/dev/null 2>&1 \
   && ! "$VENV/bin/python" -c "import sys; from phantom.proc.malloc import tcmalloc_path; sys.exit(tcmalloc_path() is None)"; then
  # ~1 MB; a training step of the 0.35M-parameter lab model is thousands of small allocations
  echo "[setup] installing Debian libtcmalloc-minimal4 for the CPU lab"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; } \
    || echo "[setup] could not install libtcmalloc-minimal4: the lab keeps glibc's malloc (same numbers, 2-5% slower)"
fi

if [[ ",$EXTRAS," == *",book,"* ]] && [ "${PHANTOM_SETUP_BROWSER:-1}" != 0 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing Debian chromium for the browser test"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
