#!/usr/bin/env bash
# The GPU benchmarks: flexc's CUDA kernels and GPU training step against PyTorch on the same GPU
# (bench/cuda_vs_torch.py): attention forward and forward + backward against
# torch.compile(flex_attention) with the same mask (and SDPA's flash and cuDNN backends for
# dense causal), decoding as a fraction of the copy bandwidth, the fused loss against
# PyTorch's, and training tokens/s and device memory against a PyTorch training step of the
# same model, eager and compiled. Alternates flexc and the peer; median of the per-round ratios.
#
#   make build-gpu                on the build machine (see scripts/gpu-check.sh)
#   scripts/gpu-bench.sh [DIR] [--quick] [--rounds N] [--reps N] [--only attn,decode,lce,train]
#                                 on the GPU machine
#
# Paths to carry: the repository's tracked files and build-gpu/gpu-bundle.tar.xz (holds
# bench_cuda and flexc, self-contained like the test programs; unpacked here when missing).
# Needs python3 with torch (CUDA) there. --quick: the two head-dim-128 attention cases, decode,
# the loss and one training round (a few minutes, most of it torch.compile). Prints one JSON
# object per case and peer; nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
if [[ $# -gt 0 && $1 != --* ]]; then
    build=$1
    shift
fi
if [[ ! -x $build/bench_cuda && -f $build/gpu-bundle.tar.xz ]]; then
    xz -dc "$build/gpu-bundle.tar.xz" | tar -xf - -C "$build"
fi
if [[ ! -x $build/bench_cuda ]]; then
    echo "gpu-bench: $build/bench_cuda is missing: run 'make build-gpu' on the build machine and carry it" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
echo "built from commit $(cat "$build/commit" 2>/dev/null || echo unknown)"
export PYTHONUNBUFFERED=1
exec python3 bench/cuda_vs_torch.py "$build" "$@"
