#!/usr/bin/env bash
# Fetches NVIDIA's header-only cudnn-frontend C++ API (the cuDNN graph API
# behind loom's fused convolution graphs, ops/cuda/conv2d_graph.cpp) into
# .deps/cudnn-frontend/include, from the nvidia-cudnn-frontend wheel on the
# Python package index (its headers lie at the wheel's root, in include/).
# The one place its version is pinned. CMake finds the headers there (or
# under -DCUDNN_FRONTEND_INCLUDE_DIR); without them loom builds the unfused
# path only. Called by scripts/setup.sh and scripts/gpu-deps.sh.
#   scripts/fetch-cudnn-frontend.sh     (about 3 MB of headers; needs pip and network)
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
target=.deps/cudnn-frontend
if [[ -f $target/include/cudnn_frontend_version.h ]] &&
   grep -q "^$version\$" "$target/VERSION" 2>/dev/null; then
  exit 0
fi
python=${PYTHON:-python3}
download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
# The wheel is tagged per Python and platform; its headers are the same in every one.
if ! "$python" -m pip download -q --no-deps --only-binary=:all: --dest "$download" \
     "nvidia-cudnn-frontend==$version" >"$download/pip.log" 2>&1; then
  echo "fetch-cudnn-frontend: could not download nvidia-cudnn-frontend $version with $python -m pip" \
       "(no pip or no network?):" >&2
  tail -n 3 "$download/pip.log" >&2
  exit 1
fi
rm -rf "$target"
mkdir -p "$target"
# Only include/ from the wheel: the Python module beside it is not needed.
"$python" - "$download" "$target" <<'PY'
import pathlib, sys, zipfile
download, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(download.glob("*.whl"))
with zipfile.ZipFile(wheel) as archive:
    members = [m for m in archive.namelist() if m.startswith("include/") and not m.endswith("/")]
    archive.extractall(target, members)
PY
echo "$version" >"$target/VERSION"
[[ -f $target/include/cudnn_frontend.h ]] || { echo "fetch-cudnn-frontend: the wheel has no include/cudnn_frontend.h" >&2; exit 1; }
echo "fetch-cudnn-frontend: cudnn-frontend $version headers in $target/include"
