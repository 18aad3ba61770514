#!/usr/bin/env bash
# The GPU kit's first step (tests/gpu/README.md): what the machine has, and whether each kit
# binary loads with the kit's libraries.
#
#   KIT_LD_PATH=... PYTHON=python3 preflight.sh KIT/bin
#
# Contract: prints `== name` sections (date, nvidia-smi, nvcc, python, torch, glibc) and then one
# line per binary in KIT/bin: `kit-load NAME ok` or `kit-load NAME fail: <the loader's message>`
# (each binary is started with its listing flag under LD_LIBRARY_PATH=$KIT_LD_PATH; only a loader
# error counts as a failure). report.py reads the kit-load lines. Always exits 0.
bin=${1:?usage: preflight.sh KIT/bin}
python=${PYTHON:-python3}

echo "== date"; date -u +%FT%TZ
echo "== nvidia-smi"; timeout 20 nvidia-smi 2>&1 | head -20
echo "== nvcc"; (command -v nvcc && timeout 20 nvcc --version) 2>&1 | tail -2
echo "== python"; timeout 20 "$python" -c 'import sys; print(sys.version)' 2>&1
echo "== torch"
timeout 60 "$python" -c 'import torch; print(torch.__version__, torch.version.cuda,
      torch.cuda.is_available())' 2>&1 | tail -1
echo "== glibc"; getconf GNU_LIBC_VERSION 2>&1
for b in "$bin"/*; do
  name=$(basename "$b")
  case $name in
    *_test) flag=--gtest_list_tests ;;
    *_bench) flag=--benchmark_list_tests ;;
    *) flag=--help ;;
  esac
  err=$(LD_LIBRARY_PATH=${KIT_LD_PATH:-} timeout 20 "$b" "$flag" 2>&1 >/dev/null)
  if grep -q 'error while loading shared libraries\|version .* not found' <<<"$err"; then
    echo "kit-load $name fail: $(head -c 300 <<<"$err" | tr '\n' ' ')"
  else
    echo "kit-load $name ok"
  fi
done
exit 0
