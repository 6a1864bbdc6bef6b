#!/usr/bin/env bash
# The GPU checks, on a machine with a CUDA GPU, from a build made beforehand on another one.
#
#   make build-gpu             on the build machine (nvcc, BLIS, jansson, PCRE2, utf8proc
#                              installed): makes build-gpu/ with CUDA on, MPI off, the GPU test
#                              programs, bench_cuda and the flexc command linked statically
#                              against BLIS, libgomp, jansson, PCRE2, utf8proc and the CUDA runtime
#   scripts/gpu-check.sh [DIR] on the GPU machine (DIR: the build directory, default build-gpu)
#
# Paths to carry to the GPU machine: the repository's tracked files, and
#   build-gpu/gpu-bundle.tar.xz   (every test_cuda_gpu_* program, bench_cuda, flexc, the host
#                               CPU's bfloat16 GEMM test and benchmark, and the commit they were
#                               built from; unpacked here when missing)
# The programs need only libc, libm, libstdc++, libgcc_s and the CUDA driver; this script prints
# `ldd` for each and stops if a library is missing. cuBLASLt (the matrix products) is opened at
# run time: the script adds the CUDA toolkit's and PyTorch's library folders to the search path
# when they exist. No network, no BLIS, MPI or jansson needed there.
#
# What runs (each program at most 240 s, the whole under 5 minutes):
#   1. every test_cuda_gpu_* program: each device call against the CPU path of the same call,
#      and each device call twice, bitwise equal;
#   2. training on the GPU against the CPU (the `small` preset, 20 steps, float32 and bf16):
#      the losses step by step within tolerance, two GPU runs bitwise equal (their checkpoints
#      compared byte for byte), and a run moved across devices with --resume (GPU -> CPU and
#      CPU -> GPU) ending at the uninterrupted run's loss;
#   3. the host CPU's bfloat16 GEMM test and benchmark.
# Prints a summary line `gpu-check: pass` or what failed, for the verification log of
# docs/cuda.md. Exit status: 0 when every check passed, 1 when any failed, 2 when the build is
# missing, 77 when no GPU is visible.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
if [[ ! -x $build/flexc && -f $build/gpu-bundle.tar.xz ]]; then
    xz -dc "$build/gpu-bundle.tar.xz" | tar -xf - -C "$build"
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         "$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)"; do
    [[ -d $d ]] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
mapfile -t tests < <(cd "$build" && ls test_cuda_gpu_* 2>/dev/null | grep -v '\.' )

echo "==== machine"
date -u +"%Y-%m-%d %H:%M UTC"
echo "built from commit $(cat "$build/commit" 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi: not found"
fi
if [[ ${#tests[@]} -eq 0 ]]; then
    echo "gpu-check: no test_cuda_gpu_* program in $build: run 'make build-gpu' on the build machine and carry it" >&2
    exit 2
fi
for t in "${tests[@]}" flexc; do
    if [[ ! -x $build/$t ]]; then
        echo "gpu-check: $build/$t is missing: run 'make build-gpu' on the build machine and carry it" >&2
        exit 2
    fi
    if ldd "$build/$t" | grep -q "not found"; then
        ldd "$build/$t"
        echo "gpu-check: $t needs shared libraries this machine lacks" >&2
        exit 2
    fi
done

failed=()
passed=0
skipped=0
for t in "${tests[@]}"; do
    echo "==== $t"
    start=$(date +%s%N)
    timeout 240 "$build/$t"
    rc=$?
    echo "---- $t: exit $rc, $((($(date +%s%N) - start) / 1000000)) ms"
    case $rc in
    0) passed=$((passed + 1)) ;;
    77) skipped=$((skipped + 1)) ;;
    124) echo "gpu-check: $t timed out (a hang is a bug: kernels must never wait forever)"; failed+=("$t (timeout)") ;;
    *) failed+=("$t (exit $rc)") ;;
    esac
done

# ---- training: the GPU against the CPU ---------------------------------------------------------
flexc=$build/flexc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat README.md docs/*.md > "$work/corpus.txt"
train() { # NAME DEVICE DTYPE [extra options]: one run into $work/NAME
    local name=$1 dev=$2 dt=$3
    shift 3
    local start
    start=$(date +%s%N)
    if ! timeout 240 "$flexc" train --model small --data "$work/corpus.txt" --steps 20 --batch 8 --seq 256 \
            --seed 7 --lr 1e-3 --warmup 2 --eval-every 10 --quiet --device "$dev" --dtype "$dt" \
            --out "$work/$name" "$@" >"$work/$name.log" 2>&1; then
        echo "---- train $name: failed"
        tail -5 "$work/$name.log"
        return 1
    fi
    echo "---- train $name: $((($(date +%s%N) - start) / 1000000)) ms"
}
# Step losses of two runs: the largest relative difference, and whether it is within tol.
losses_close() { # A B TOL
    python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" <<'EOF'
import json, sys
def steps(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b, tol = steps(sys.argv[1]), steps(sys.argv[2]), float(sys.argv[3])
common = sorted(set(a) & set(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in common)
print(f"     {len(common)} steps, largest relative loss difference {worst:.2e} (tolerance {tol:g}), "
      f"final {a[common[-1]]:.5f} / {b[common[-1]]:.5f}")
sys.exit(0 if len(common) >= 10 and worst <= tol else 1)
EOF
}
echo "==== training on the GPU against the CPU (small, 20 steps, B 8, T 256)"
if "$flexc" train --help 2>&1 | grep -q -- "--device"; then
    for dt in f32 bf16; do
        tol=2e-3
        [[ $dt == bf16 ]] && tol=2e-2
        train "cpu-$dt" cpu "$dt" --force || failed+=("train cpu $dt")
        train "gpu-$dt" cuda "$dt" --force || failed+=("train gpu $dt")
        train "gpu-$dt-again" cuda "$dt" --force || failed+=("train gpu $dt (again)")
        if [[ -f $work/gpu-$dt/checkpoint.safetensors ]]; then
            echo "  $dt: GPU against CPU"
            losses_close "cpu-$dt" "gpu-$dt" "$tol" || failed+=("train $dt: GPU loss against CPU")
            if cmp -s "$work/gpu-$dt/checkpoint.safetensors" "$work/gpu-$dt-again/checkpoint.safetensors"; then
                echo "  $dt: two GPU runs bitwise equal"
            else
                echo "  $dt: two GPU runs differ"
                failed+=("train $dt: GPU runs not bitwise equal")
            fi
        fi
    done
    # Across devices: 10 steps on one, --resume to 20 on the other.
    for pair in "cuda cpu" "cpu cuda"; do
        read -r first second <<<"$pair"
        name="resume-$first-$second"
        if train "$name" "$first" f32 --force --until 10 && train "$name" "$second" f32 --resume; then
            echo "  f32: 10 steps on $first, resumed on $second, against 20 on $first"
            ref=gpu-f32
            [[ $first == cpu ]] && ref=cpu-f32
            losses_close "$ref" "$name" 2e-3 || failed+=("train: resumed $first -> $second")
        else
            failed+=("train: resume $first -> $second")
        fi
    done
else
    echo "  this flexc has no --device option"
    failed+=("train: no --device")
fi

# ---- the host CPU -----------------------------------------------------------------------------
# GPU machines' CPUs often have AVX512-BF16 and AMX-BF16, which the build machine lacks; the
# bfloat16 GEMM's test then runs its vdpbf16ps and AMX kernels natively, and the benchmark gives
# the CPU's path's speed against the float32 GEMM (docs/bf16.md).
cpu_bf16="no AVX512-BF16"
grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && cpu_bf16="AVX512-BF16"
grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null && cpu_bf16="$cpu_bf16, AMX-BF16"
cpu_test="missing"
if [[ -x $build/test_gemm_bf16_portable ]]; then
    echo "==== host CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs ($cpu_bf16)"
    timeout 240 "$build/test_gemm_bf16_portable" >"$work/gemm_bf16.log" 2>&1
    rc=$?
    tail -1 "$work/gemm_bf16.log"
    cpu_test="exit $rc"
    [[ $rc -eq 0 ]] || failed+=("test_gemm_bf16 (exit $rc)")
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "==== summary: $(date -u +%Y-%m-%d) | ${gpu:-no GPU} | commit $(cat "$build/commit" 2>/dev/null || echo unknown) |" \
     "programs passed $passed, skipped $skipped, of ${#tests[@]} | host CPU ($cpu_bf16): test_gemm_bf16 $cpu_test"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "gpu-check: FAILED: ${failed[*]}"
    exit 1
fi
if [[ $passed -eq 0 ]]; then
    echo "gpu-check: skipped (no GPU)"
    exit 77
fi
echo "gpu-check: pass"
exit 0
