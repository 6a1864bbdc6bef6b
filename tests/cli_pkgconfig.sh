#!/usr/bin/env bash
# flexc.pc: a program that uses every module builds against the uninstalled tree with
# `pkg-config --cflags --libs flexc` (the README's command), and statically with
# `pkg-config --static`, and runs.
set -u
flexc=${1:?path to flexc}
build=${FLEXC_BUILD_DIR:-$(dirname "$flexc")}
tmp=$(mktemp -d /tmp/flexc_cli_pkgconfig.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
export PKG_CONFIG_PATH="$build${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

cat > "$tmp/prog.c" <<'PROG'
#include <flexc.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    float q[4] = {1, 0, 0, 1}, out[4];
    fx_attention a = {.B = 1, .Hq = 1, .Hkv = 1, .Lq = 2, .Lkv = 2, .D = 2, .Dv = 2};
    int rc = fx_flex_attention(&a, q, q, q, out, NULL);
    int64_t target[2] = {0, 1};
    float loss;
    fx_lce p = fx_lce_defaults(2, 2, 2);
    rc |= fx_linear_cross_entropy(&p, q, q, NULL, target, &loss, NULL, NULL, NULL, NULL);
    fx_safetensors *f;
    if (fx_safetensors_open(&f, "/nonexistent.safetensors") == FX_OK)
        fx_safetensors_free(f);
    fx_rng r;
    fx_rng_init(&r, 1, 0);
    /* Linked, not run: MPI start-up is not what this checks. */
    if (argc > 99) {
        fx_comm *c;
        if (fx_comm_init(&c, &argc, &argv) == FX_OK)
            fx_comm_free(c);
    }
    printf("%s %d %.4f\n", fx_version(), rc, (double)loss);
    return rc != FX_OK;
}
PROG
# An instrumented library needs the sanitizer runtimes in the program too.
san=()
grep -q '^FLEXC_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null && san=(-fsanitize=address,undefined)
export ASAN_OPTIONS=detect_leaks=0

check pc-exists 0 pkg-config --exists flexc
check shared-link 0 cc "${san[@]}" "$tmp/prog.c" $(pkg-config --cflags --libs flexc) -o "$tmp/prog_shared"
check shared-run 0 "$tmp/prog_shared"
contains shared-output "$tmp/out" "^$("$flexc" --version | cut -d' ' -f2) 0 "
static_libs=$(pkg-config --cflags --static --libs flexc | sed "s#-lflexc#$build/libflexc.a#")
check static-link 0 cc "${san[@]}" "$tmp/prog.c" $static_libs -o "$tmp/prog_static"
check static-run 0 "$tmp/prog_static"
# The static flags name the BLIS build the library itself loads (the OpenMP one where it
# was built with OpenMP), not whichever build a library search would find first.
blas_dir=$(ldd "$build/libflexc.so" 2>/dev/null | sed -n 's#.*=> \(.*\)/libblis[^/]*\.so.*#\1#p' | head -1)
if [[ -n $blas_dir ]]; then
    real=$(readlink -f "$blas_dir")
    found=no
    for d in $(pkg-config --static --libs-only-L flexc | tr ' ' '\n' | sed -n 's#^-L##p'); do
        [[ $(readlink -f "$d") == "$real" ]] && found=yes
    done
    [[ $found == yes ]] && ok || bad "static-blis: flexc.pc does not name $blas_dir: $(pkg-config --static --libs flexc)"
fi
finish cli_pkgconfig
