#!/usr/bin/env bash
# black --check and flake8 over every Python file in client/python, tests and deploy, with the
# repository's settings (pyproject.toml, .flake8). Fails on any finding. To fix formatting:
#   black --config pyproject.toml client/python tests deploy
set -uo pipefail
cd "$(dirname "$0")/../.."
dirs=(client/python tests deploy)

for tool in black flake8; do
  if ! command -v "$tool" >/dev/null; then
    echo "python_lint_test: $tool not found (deploy/install-deps.sh installs it)"
    exit 1
  fi
done

status=0
if ! black --config pyproject.toml --check --quiet "${dirs[@]}"; then
  black --config pyproject.toml --check "${dirs[@]}" 2>&1 | grep '^would reformat'
  echo "python_lint_test: black would reformat the files above:"
  echo "  black --config pyproject.toml ${dirs[*]}"
  status=1
fi
if ! flake8 --config .flake8 "${dirs[@]}"; then
  echo "python_lint_test: flake8 findings above"
  status=1
fi
[ $status -eq 0 ] && echo "python_lint_test: black and flake8 clean over ${dirs[*]}"
exit $status
