# Sourced by the benchmarks that run a PyTorch peer: chooses the Python that
# runs benchmarks/peers/*.py and says which PyTorch it has.
#   LOOM_PEER_PYTHON  a python with torch (and torchvision) to use; otherwise
#                     ./.venv/bin/python when present (scripts/setup.sh --peers
#                     installs PyTorch 2.x there), else /usr/bin/python3
#                     (Debian's python3-torch 1.13).
# Sets peer_python and peer_version ("torch 2.x.y, torchvision 0.z"); an empty
# peer_version means that python cannot import torch and torchvision.
peer_python=${LOOM_PEER_PYTHON:-}
if [[ -z "$peer_python" ]]; then
  if [[ -x .venv/bin/python ]]; then peer_python=.venv/bin/python; else peer_python=/usr/bin/python3; fi
fi
peer_version=$("$peer_python" -c 'import torch, torchvision; print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")' 2>/dev/null || true)
if [[ -n "${LOOM_PEER_PYTHON:-}" && -z "$peer_version" ]]; then
  echo "LOOM_PEER_PYTHON=$LOOM_PEER_PYTHON cannot import torch and torchvision" >&2
  exit 1
fi
