#!/usr/bin/env bash
# flexc --version: the version line, then one line per module naming the kernel table it
# dispatches through (docs/dispatch.md), which FLEXC_ISA lowers.
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_version

modules="attention|attention backward|attention bf16|mod|lce|gemm|gemv|bf16 conversion|bf16 gemm|rmsnorm|swiglu|optim|finite|cuda"
# Every line after the first is "module: path", each module once, in this order.
lines_ok() {
    local name=$1 file=$2
    contains "$name version" "$file" "^flexc [0-9]*\.[0-9]*\.[0-9]*$"
    if [[ $(head -n 1 "$file") == flexc\ * ]]; then ok; else bad "$name: the version is not the first line"; fi
    local got
    got=$(tail -n +2 "$file" | sed 's/: .*//' | paste -sd '|')
    if [[ $got == "$modules" ]]; then ok; else bad "$name: modules '$got', expected '$modules'"; cat "$file"; fi
    if tail -n +2 "$file" | grep -qv '^[a-z0-9 ]*: [^ ].*$'; then bad "$name: a line is not 'module: path'"; cat "$file"; else ok; fi
}

check default 0 "$flexc" --version
cp "$tmp/out" "$tmp/default"
lines_ok default "$tmp/default"
contains default-attention "$tmp/default" "^attention: \(scalar\|avx2\|avx512\)$"
contains default-gemm "$tmp/default" "^gemm: \(own avx512\|blis\|reference\)$"
contains default-bf16-gemm "$tmp/default" "^bf16 gemm: \(amx\|vdpbf16ps\|float32 (own avx512)\|float32 (blis)\|float32 (reference)\)$"
contains default-lce "$tmp/default" "^lce: \(scalar\|avx2\|avx512\) (products: \(lce kernels\|blas\))$"
contains default-cuda "$tmp/default" "^cuda: ."

# The scalar path: every CPU module says so, whatever the CPU.
check scalar 0 env FLEXC_ISA=scalar "$flexc" --version
cp "$tmp/out" "$tmp/scalar"
lines_ok scalar "$tmp/scalar"
for m in attention "attention backward" mod gemv "bf16 conversion" rmsnorm swiglu optim finite; do
    contains "scalar $m" "$tmp/scalar" "^$m: scalar$"
done
contains scalar-attention-bf16 "$tmp/scalar" "^attention bf16: float32$"
contains scalar-lce "$tmp/scalar" "^lce: scalar (products: lce kernels)$"
contains scalar-gemm "$tmp/scalar" "^gemm: \(blis\|reference\)$"
contains scalar-bf16-gemm "$tmp/scalar" "^bf16 gemm: float32 (\(blis\|reference\))$"
same scalar-cuda <(grep '^cuda:' "$tmp/default") <(grep '^cuda:' "$tmp/scalar")

# Forcing a lower path changes the lines on a CPU that has a higher one.
best=$(sed -n 's/^attention: //p' "$tmp/default")
if [[ $best != scalar ]]; then
    if cmp -s "$tmp/default" "$tmp/scalar"; then bad "FLEXC_ISA=scalar changed nothing"; else ok; fi
    check avx2 0 env FLEXC_ISA=avx2 "$flexc" --version
    cp "$tmp/out" "$tmp/avx2"
    lines_ok avx2 "$tmp/avx2"
    for m in attention "attention backward" gemv "bf16 conversion" rmsnorm swiglu optim finite; do
        contains "avx2 $m" "$tmp/avx2" "^$m: avx2$"
    done
    contains avx2-lce "$tmp/avx2" "^lce: avx2 (products: blas)$"
    contains avx2-gemm "$tmp/avx2" "^gemm: blis$"
    contains avx2-bf16-gemm "$tmp/avx2" "^bf16 gemm: float32 (blis)$"
fi
if [[ $best == avx512 ]]; then
    contains avx512-gemm "$tmp/default" "^gemm: own avx512$"
    contains avx512-lce "$tmp/default" "^lce: avx512 (products: lce kernels)$"
fi
# A path the CPU lacks or an unknown name is not taken: the best one the CPU has.
check bogus 0 env FLEXC_ISA=bogus "$flexc" --version
same bogus-is-default "$tmp/default" "$tmp/out"
finish cli_version
