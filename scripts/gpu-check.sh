#!/usr/bin/env bash
# The GPU tests, on a machine with a CUDA GPU, from a build made beforehand on another one.
#
#   make build-gpu             on the build machine (nvcc, BLIS, jansson installed): makes
#                              build-gpu/ with CUDA on, MPI off, and the test programs linked
#                              statically against BLIS, libgomp,
#                              jansson and the CUDA runtime
#   scripts/gpu-check.sh [DIR] on the GPU machine (DIR: the build directory, default build-gpu)
#
# Paths to carry to the GPU machine: the repository's tracked files, and
#   build-gpu/gpu-bundle.tgz   (test_cuda_gpu_attention, test_cuda_gpu_lce and bench_cuda,
#                               13 MB each unpacked, and the host CPU's bfloat16 GEMM test and
#                               benchmark; unpacked here when missing)
# The programs need only libc, libm, libstdc++, libgcc_s and the CUDA driver; this script
# prints `ldd` for each and stops if a library is missing. No network, no BLIS, MPI or
# jansson needed there. Runs in about a minute; each program is given at most 240 s.
#
# Prints the GPU, driver, each program's output and time, and a summary line for the
# verification table of docs/cuda.md. Exit status: 0 when every test passed, 1 when any
# failed, 2 when the build is missing, 77 when no GPU is visible.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
if [[ ! -x $build/test_cuda_gpu_attention && -f $build/gpu-bundle.tgz ]]; then
    tar -xzf "$build/gpu-bundle.tgz" -C "$build"
fi
tests=(test_cuda_gpu_attention test_cuda_gpu_lce)

echo "==== machine"
date -u +"%Y-%m-%d %H:%M UTC"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi: not found"
fi
for t in "${tests[@]}"; do
    bin=$build/$t
    if [[ ! -x $bin ]]; then
        echo "gpu-check: $bin is missing: run 'make build-gpu' on the build machine and carry it" >&2
        exit 2
    fi
    echo "---- ldd $t"
    ldd "$bin" | sed 's/ (0x.*//'
    if ldd "$bin" | grep -q "not found"; then
        echo "gpu-check: $t needs shared libraries this machine lacks" >&2
        exit 2
    fi
done

status=0
passed=0
skipped=0
for t in "${tests[@]}"; do
    echo "==== $t"
    start=$(date +%s%N)
    timeout 240 "$build/$t"
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    echo "---- $t: exit $rc, $ms ms"
    case $rc in
    0) passed=$((passed + 1)) ;;
    77) skipped=$((skipped + 1)) ;;
    124) echo "gpu-check: $t timed out (a hang is a bug: kernels must never wait forever)"; status=1 ;;
    *) status=1 ;;
    esac
done

# The host CPU: GPU machines' CPUs often have AVX512-BF16 and AMX-BF16, which the build machine
# lacks; the bfloat16 GEMM's test then runs its vdpbf16ps and AMX kernels natively, and the
# benchmark gives the CPU's path's speed against the float32 GEMM (docs/train.md).
cpu_bf16="no AVX512-BF16"
if grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null; then
    cpu_bf16="AVX512-BF16"
fi
if grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null; then
    cpu_bf16="$cpu_bf16, AMX-BF16"
fi
cpu_test="missing"
if [[ -x $build/test_gemm_bf16_portable ]]; then
    echo "==== host CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
    echo "bfloat16 flags: $(grep -m1 -ow 'avx512_bf16\|amx_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    timeout 240 "$build/test_gemm_bf16_portable"
    rc=$?
    cpu_test="exit $rc"
    [[ $rc -eq 0 ]] || status=1
    for th in 2 "$(nproc)"; do
        echo "---- bench_gemm_bf16, $th threads"
        OMP_NUM_THREADS=$th timeout 120 "$build/bench_gemm_bf16_portable" 5
    done
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "==== summary: $(date -u +%Y-%m-%d) | ${gpu:-no GPU} | passed $passed, skipped $skipped, of ${#tests[@]} | host CPU ($cpu_bf16): test_gemm_bf16 $cpu_test"
if [[ $status -ne 0 ]]; then
    exit 1
fi
if [[ $passed -eq 0 ]]; then
    exit 77
fi
exit 0
