#!/usr/bin/env bash
# The GPU checks, in one go, for whoever has a CUDA machine (docs/gpu.md, "Checking a GPU machine").
#   scripts/gpu_check.sh [--no-install]
# Installs madsl with the cuda and dev extras (mamba-ssm and causal-conv1d compile against the
# local torch: --no-build-isolation), runs the CUDA test lane and the cost benchmark, and
# leaves everything it prints in gpu-check-<date>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
log="gpu-check-$(date +%Y%m%d-%H%M%S).log"
exec > >(tee "$log") 2>&1

python -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
if [[ "${1:-}" != "--no-install" ]]; then
    pip install -e '.[dev]'
    pip install --no-build-isolation -e '.[cuda]'
fi
python -m madsl.kernels.cuda  # which libraries of the cuda extra import
python -m pytest -v tests/test_cuda.py tests/test_gpu_paths.py tests/test_precision.py
# each task's baseline, one run against the paper grid stacked and graph-replayed (steady epochs),
# every sequence length of the sweeps measured as `madsl eval` trains it (--shapes), and three
# workers sharing the GPU
python benchmarks/protocol_cost.py --device cuda --precision bf16 --grid-examples baseline --grid-modes stacked graphs \
    --shapes --workers-per-device 3 --specs specs/paper/*.mad
echo "log: $log"
