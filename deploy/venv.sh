#!/usr/bin/env bash
# Creates or refreshes the project's virtualenv (.venv at the checkout's root, ignored by git) from
# requirements/test.lock: PyPI's torch, transformers, TRL, verl, grpcio, protobuf, numpy, pytest
# and the packaging tools, every package pinned. The venv is built on Debian's /usr/bin/python3
# (python3-venv, python3-dev from deploy/install-deps.sh), the interpreter the C++ build makes the
# Python package for. It is reused as long as the lock has not changed (its sha256 is kept in
# .venv/packsched-lock.sha256); a changed lock reinstalls into a fresh venv.
#
#   deploy/venv.sh            # create or reuse; prints the venv's python
#   deploy/venv.sh --relock   # resolve requirements/test.in afresh and rewrite the lock
#
# PACKSCHED_VENV puts the venv elsewhere. pip's cache (~/.cache/pip) makes a rebuild quick.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${PACKSCHED_VENV:-$PWD/.venv}"
lock=requirements/test.lock
base=/usr/bin/python3

if [ "${1:-}" = "--relock" ]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  "$base" -m venv "$scratch/venv"
  "$scratch/venv/bin/pip" install -q --upgrade pip
  "$scratch/venv/bin/pip" install -q -r requirements/test.in
  {
    sed -n '1,/^# Regenerate/p' "$lock"
    "$scratch/venv/bin/pip" freeze --exclude-editable
  } > "$lock.new"
  mv "$lock.new" "$lock"
  echo "venv: rewrote $lock ($(grep -vc '^#' "$lock") packages)" >&2
  exit 0
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
"$venv/bin/python" -c 'import torch, transformers, trl, numpy, grpc, google.protobuf, pytest' >&2
echo "$want" > "$venv/packsched-lock.sha256"
echo "venv: ready ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
echo "$venv/bin/python"
