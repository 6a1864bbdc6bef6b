#!/usr/bin/env bash
# Installs the Debian packages flexc needs, only those that are missing.
#   scripts/deps.sh          build, test and run: compiler, CMake, BLIS, Open MPI, jansson,
#                            PCRE2, utf8proc, cairo and a font (flexc plot), corpus, SIMDe
#                            (the tests' portable build of the AVX512-BF16 kernel)
#   scripts/deps.sh ci       also what CI's extra passes use (clang and its fuzzing runtime, pip)
#                            and oneDNN (the bfloat16 GEMM's peer, bench/gemm_bf16_onednn.c)
# As root it installs directly; otherwise through sudo when that works without a password;
# otherwise it prints the apt-get line to run and fails.
set -euo pipefail

packages=(build-essential cmake pkg-config libblis-dev libblis4-openmp libopenmpi-dev openmpi-bin
          libjansson-dev libpcre2-dev libutf8proc-dev libcairo2-dev libfontconfig-dev fonts-dejavu-core
          fortunes-min fortunes libsimde-dev)
if [[ "${1:-}" == ci ]]; then
    packages+=(clang libclang-rt-14-dev python3 python3-pip libdnnl-dev)
fi

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "flexc: installing missing packages: ${missing[*]}" >&2
if [[ $(id -u) -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "flexc: error: missing packages and no root rights; run:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
