#!/usr/bin/env bash
# clang-format (the repository's .clang-format: Google style, 100 columns) over every tracked C++
# and CUDA source: server, client, kernels, tests.
#
#   tests/lint/format.sh          check: lists the files that differ, exits 1 if any (ctest
#                                 clang_format_test)
#   tests/lint/format.sh --fix    formats them in place
#
# clang-format 14 (Debian 12, deploy/install-deps.sh): other versions format some constructs
# differently, so the check and the fix must use the same one. Outside a git checkout the files
# are found by extension instead.
set -uo pipefail
cd "$(dirname "$0")/../.."

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: tests/lint/format.sh [--fix]" >&2; exit 2 ;;
esac

tool=""
for name in clang-format-14 clang-format; do
  if command -v "$name" >/dev/null; then tool=$name; break; fi
done
if [ -z "$tool" ]; then
  echo "clang_format_test: clang-format not found (deploy/install-deps.sh installs it)"
  exit 1
fi

dirs=(server client kernels tests)
patterns=('*.cc' '*.h' '*.cu' '*.cuh')
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # A pathspec's * also matches /: server/*.cc is every .cc file under server/.
  mapfile -t files < <(for d in "${dirs[@]}"; do
    for p in "${patterns[@]}"; do git ls-files -- "$d/$p"; done
  done | sort -u)
else
  mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \
    -o -name '*.cuh' \) | sort)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "clang_format_test: no C++ sources found"
  exit 1
fi

if [ $fix -eq 1 ]; then
  if ! printf '%s\0' "${files[@]}" | xargs -0 "$tool" -i --style=file; then
    echo "format.sh: $tool failed"
    exit 1
  fi
  echo "format.sh: formatted ${#files[@]} files with $tool"
  exit 0
fi

# One process for every file; each difference is reported as "FILE:LINE:COL: error: ...".
output=$(printf '%s\0' "${files[@]}" | xargs -0 "$tool" --dry-run -Werror --style=file 2>&1)
status=$?
mapfile -t differ < <(sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*/\1/p' <<<"$output" | sort -u)
if [ $status -ne 0 ] && [ ${#differ[@]} -eq 0 ]; then
  echo "$output" | tail -20
  echo "clang_format_test: $tool failed (exit $status)"
  exit 1
fi
if [ ${#differ[@]} -gt 0 ]; then
  printf '  %s\n' "${differ[@]}"
  echo "clang_format_test: ${#differ[@]} of ${#files[@]} files differ from .clang-format ($tool)"
  echo "  fix: tests/lint/format.sh --fix   (or see one: $tool --dry-run FILE)"
  exit 1
fi
echo "clang_format_test: ${#files[@]} files clean ($tool)"
