#!/usr/bin/env bash
# The GPU benchmarks: flexc's CUDA kernels against PyTorch on the same GPU (bench/cuda_vs_torch.py:
# torch.compile(flex_attention) and SDPA for attention, the unfused cross-entropy for the
# fused loss), alternating flexc and the peer, median of the per-round ratios.
#
#   make build-gpu                on the build machine (see scripts/gpu-check.sh)
#   scripts/gpu-bench.sh [DIR] [--quick] [--rounds N] [--reps N]   on the GPU machine
#
# Paths to carry: the repository's tracked files and build-gpu/gpu-bundle.tgz (holds
# bench_cuda, self-contained like the test programs; unpacked here when missing). Needs python3 with torch (CUDA) there. --quick runs one attention
# case and one loss case (about 2 minutes, most of it torch.compile); the full set takes
# about 10 minutes. Prints one JSON object per case and peer; nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
if [[ $# -gt 0 && $1 != --* ]]; then
    build=$1
    shift
fi
if [[ ! -x $build/bench_cuda && -f $build/gpu-bundle.tgz ]]; then
    tar -xzf "$build/gpu-bundle.tgz" -C "$build"
fi
if [[ ! -x $build/bench_cuda ]]; then
    echo "gpu-bench: $build/bench_cuda is missing: run 'make build-gpu' on the build machine and carry it" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
exec python3 bench/cuda_vs_torch.py "$build" "$@"
