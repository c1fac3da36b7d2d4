#!/usr/bin/env bash
# Spells every include of loom's own headers as users do: #include "core/tensor.h"
# becomes #include <loom/core/tensor.h>, for the library directories core, ops,
# nn, optim, data and dist, in every C++/CUDA source and Markdown file git knows
# (tracked, or untracked and not ignored). Idempotent: a second run changes nothing.
#   scripts/dev/prefix-includes.sh           rewrite in place
#   scripts/dev/prefix-includes.sh --check   list the includes still spelled the old way; exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/../.."

pattern='^([[:space:]]*#[[:space:]]*include[[:space:]]*)"((core|ops|nn|optim|data|dist)/[^"]+)"'
mapfile -t files < <(git ls-files -co --exclude-standard -- \
  '*.h' '*.hpp' '*.cpp' '*.cc' '*.cu' '*.cuh' '*.md' | while read -r f; do [[ -f "$f" ]] && echo "$f"; done)
(( ${#files[@]} )) || exit 0

if [[ "${1:-}" == "--check" ]]; then
  if grep -EnH "$pattern" "${files[@]}"; then
    echo "prefix-includes: the includes above name loom's headers without <loom/...>; run scripts/dev/prefix-includes.sh" >&2
    exit 1
  fi
  exit 0
fi
{ grep -El "$pattern" "${files[@]}" || true; } | while read -r f; do
  sed -E -i "s@${pattern}@\\1<loom/\\2>@" "$f"
  echo "rewrote $f"
done
