#!/usr/bin/env bash
# Prepares .deps/: the Debian 12 packages loom's build needs beside CUDA
# (Eigen, doctest, CLI11, nlohmann-json, Gloo with its runtime libraries,
# zlib) unpacked into one prefix, for a GPU machine without network access.
# Run it on a Debian 12 machine with apt; then carry .deps with the working
# tree: scripts/gpu-check.sh uses it for whatever the GPU machine lacks. It
# also copies the PyTorch peer ../shared/peers/torch_resnet_gpu.py, unchanged,
# into .deps/peers for scripts/gpu-perf.sh (the ../shared beside the checkout
# does not travel with it), and fetches the cudnn-frontend headers into
# .deps/cudnn-frontend (scripts/fetch-cudnn-frontend.sh; the GPU machine has
# no network to fetch them itself).
#   scripts/gpu-deps.sh        (writes .deps/root/usr/...; about 10 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(libeigen3-dev doctest-dev libcli11-dev nlohmann-json3-dev libgloo-dev libgloo0 libhiredis0.14
          libibverbs1 libnl-3-200 libnl-route-3-200 zlib1g-dev zlib1g libturbojpeg0-dev libturbojpeg0)
rm -rf .deps
mkdir -p .deps/debs .deps/root
(cd .deps/debs && apt-get -o APT::Sandbox::User=root download "${packages[@]}" >/dev/null)
for deb in .deps/debs/*.deb; do dpkg-deb -x "$deb" .deps/root; done
rm -rf .deps/debs .deps/root/usr/share/doc .deps/root/usr/share/man
# Absolute symlinks (libz.so -> /lib/...) point into the prefix instead.
while IFS= read -r link; do
  target=.deps/root$(readlink "$link")
  [[ -e $target ]] && ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$target")" "$link"
done < <(find .deps/root -type l -lname '/*')
# Gloo's exported targets name /usr/lib/libgloo.so.0.5.0: make them relative
# to the prefix the config file sits in.
sed -i 's#"/usr/lib/#"${_IMPORT_PREFIX}/lib/#g' .deps/root/usr/share/cmake/Gloo/GlooTargets-*.cmake
scripts/fetch-cudnn-frontend.sh ||
  echo "gpu-deps: no cudnn-frontend headers: the GPU build will have the unfused convolutions only" >&2
if [[ -f ../shared/peers/torch_resnet_gpu.py ]]; then
  mkdir -p .deps/peers && cp ../shared/peers/torch_resnet_gpu.py .deps/peers/
else
  echo "gpu-deps: no ../shared/peers/torch_resnet_gpu.py: gpu-perf.sh will need LOOM_PERF_PEER" >&2
fi
# Keep the unpacked tree out of git (it travels as an ignored, carried path);
# git-path finds the exclude file in a worktree too, where .git is a file.
if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.deps/' "$exclude" 2>/dev/null || echo '/.deps/' >> "$exclude"
fi
du -sh .deps | sed 's/^/gpu-deps: /'
