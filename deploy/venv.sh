#!/usr/bin/env bash
# Creates or refreshes one of the project's virtualenvs from a lock file and prints its python.
# The default is .venv (ignored by git) from requirements/test.lock: PyPI's torch, transformers,
# TRL, verl, grpcio, protobuf, numpy, pytest and the packaging tools, every package pinned. Every
# venv is built on Debian's /usr/bin/python3 (python3-venv and python3-dev from
# deploy/install-deps.sh), the interpreter the C++ build makes the Python package for, and is
# reused as long as its lock has not changed (the lock's sha256 is kept in the venv); a changed
# lock reinstalls into a fresh venv. pip's cache (~/.cache/pip) makes a rebuild quick.
#
#   deploy/venv.sh                                  # .venv from requirements/test.lock
#   deploy/venv.sh --lock requirements/oldest.lock  # .venv-oldest: the oldest supported torch
#   deploy/venv.sh --relock [--lock FILE]           # resolve FILE's .in afresh, rewrite FILE
#
# PACKSCHED_VENV puts the venv elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

lock=requirements/test.lock
relock=0
while [ $# -gt 0 ]; do
  case "$1" in
    --lock) lock="$2"; shift 2 ;;
    --relock) relock=1; shift ;;
    *) echo "usage: deploy/venv.sh [--lock FILE] [--relock]" >&2; exit 2 ;;
  esac
done
name="$(basename "$lock" .lock)"
if [ "$name" = test ]; then default_venv="$PWD/.venv"; else default_venv="$PWD/.venv-$name"; fi
venv="${PACKSCHED_VENV:-$default_venv}"
base=/usr/bin/python3

if [ $relock -eq 1 ]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  "$base" -m venv "$scratch/venv"
  "$scratch/venv/bin/pip" install -q -r "${lock%.lock}.in"
  {
    sed -n '1,/^# Regenerate/p' "$lock"
    "$scratch/venv/bin/pip" freeze --exclude-editable
  } > "$lock.new"
  mv "$lock.new" "$lock"
  echo "venv: rewrote $lock ($(grep -vc '^#' "$lock") packages)" >&2
  exit 0
fi

if grep -n ' @ \(file\|/\)' "$lock" >&2; then
  echo "venv: $lock pins a local file (above): pin a version from PyPI" >&2
  exit 1
fi
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/packsched-lock.sha256" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi

echo "venv: installing $lock into $venv (PyPI; several GB the first time)" >&2
rm -rf "$venv"
"$base" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$lock" >&2
"$venv/bin/python" -c 'import torch, numpy, pytest' >&2
echo "$want" > "$venv/packsched-lock.sha256"
echo "venv: ready ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
echo "$venv/bin/python"
