# Sourced by the throughput benchmarks that run a PyTorch peer beside loom
# (run_convnet.sh, run_resnet50.sh, dist/run_scaling_quick.sh): chooses the Python that runs
# benchmarks/peers/*.py, says which PyTorch it has, and runs the peer.
#   LOOM_PEER_PYTHON  a python with torch (and torchvision) to use; otherwise
#                     ./.venv/bin/python when present (scripts/setup.sh --peers
#                     installs PyTorch 2.x there), else /usr/bin/python3
#                     (Debian's python3-torch 1.13).
# Sets peer_python and peer_version ("torch 2.x.y, torchvision 0.z"); an empty
# peer_version means that python cannot import torch and torchvision, and the
# benchmark reports loom's figures alone.
peer_python=${LOOM_PEER_PYTHON:-}
if [[ -z "$peer_python" ]]; then
  if [[ -x .venv/bin/python ]]; then peer_python=.venv/bin/python; else peer_python=/usr/bin/python3; fi
fi
peer_version=$("$peer_python" -c 'import torch, torchvision; print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")' 2>/dev/null || true)
if [[ -n "${LOOM_PEER_PYTHON:-}" && -z "$peer_version" ]]; then
  echo "LOOM_PEER_PYTHON=$LOOM_PEER_PYTHON cannot import torch and torchvision" >&2
  exit 1
fi
if [[ -n "$peer_version" ]]; then
  echo "peer: $peer_python ($peer_version)"
else
  echo "no PyTorch with torchvision for $peer_python (scripts/setup.sh --peers): loom's figures alone" >&2
fi

# run_peers PEER ARGS...: the peer script PEER with ARGS, eager and, where this
# PyTorch has torch.compile, with --compile ($peer_modes: "eager" for eager only), every thread pool of it at
# $threads (torch.set_num_threads leaves OpenBLAS at all cores); prints each
# one's JSON line and sets peer_args to peer_summary.py's --peer arguments (a
# run that failed gives "", which peer_summary.py leaves out). Nothing without
# a peer.
run_peers() {
  local mode line extra
  peer_args=()
  [[ -n "$peer_version" ]] || return 0
  for mode in ${peer_modes:-eager torch.compile}; do
    extra=()
    if [[ $mode == torch.compile ]]; then
      "$peer_python" -c 'import sys, torch; sys.exit(not hasattr(torch, "compile"))' || break
      extra=(--compile)
    fi
    line=$(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
             "$peer_python" "$@" "${extra[@]}" | tail -n 1) || { echo "the $mode peer failed" >&2; line=""; }
    echo "$line"
    peer_args+=(--peer "$line")
  done
}
