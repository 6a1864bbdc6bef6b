#!/bin/sh
# Runs tests/amx_guest (the library's AMX-BF16 micro-kernel on a bare machine) on Bochs:
#
#   FLEXC_BOCHS=/path/to/bochs sh tests/gemm_bf16_amx_bochs.sh build/gemm_bf16_amx_guest.elf
#
# FLEXC_BOCHS: a Bochs 2.8 or later configured with at least
#   --with-nogui --enable-x86-64 --enable-avx --enable-evex --enable-amx
# Its BIOS images are taken from FLEXC_BOCHS_BIOS, else from a `bios` folder beside the binary
# (a Bochs source tree), else from /usr/local/share/bochs.
# The guest boots from a disk image made of the ELF, runs on Bochs's Sapphire Rapids model and
# prints one verdict line to port 0xE9. Exit status: 0 passed, 1 failed, 77 skipped (no
# FLEXC_BOCHS, or an emulated CPU without AMX).
set -u
elf=${1:?usage: gemm_bf16_amx_bochs.sh GEMM_BF16_AMX_GUEST_ELF}
if [ -z "${FLEXC_BOCHS:-}" ]; then
    echo "skipped: set FLEXC_BOCHS to a Bochs (2.8 or later) configured with --enable-amx"
    exit 77
fi
bios=${FLEXC_BOCHS_BIOS:-}
if [ -z "$bios" ]; then
    bios=$(dirname "$FLEXC_BOCHS")/bios
    [ -f "$bios/BIOS-bochs-latest" ] || bios=/usr/local/share/bochs
fi
vgabios=$(ls "$bios"/VGABIOS-lgpl-latest.bin "$bios"/VGABIOS-lgpl/VGABIOS-lgpl-latest.bin 2>/dev/null | head -n 1)
if [ ! -f "$bios/BIOS-bochs-latest" ] || [ -z "$vgabios" ]; then
    echo "FAIL: no BIOS-bochs-latest and VGABIOS-lgpl-latest.bin under $bios (set FLEXC_BOCHS_BIOS)"
    exit 1
fi
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
# The disk: the image from 0x7C00 on (amx_guest.ld), padded to the geometry below.
objcopy -O binary "$elf" "$dir/guest.bin" || exit 1
size=$(wc -c < "$dir/guest.bin")
if [ "$size" -gt 65024 ]; then # boot.S reads at most 127 sectors after the first
    echo "FAIL: the guest image is $size bytes; boot.S loads at most 65024"
    exit 1
fi
cp "$dir/guest.bin" "$dir/disk.img" && truncate -s $((2 * 16 * 63 * 512)) "$dir/disk.img" || exit 1
cat > "$dir/bochsrc" <<RC
megs: 64
romimage: file=$bios/BIOS-bochs-latest
vgaromimage: file=$vgabios
cpu: model=sapphire_rapids, count=1, ips=100000000, reset_on_triple_fault=0
ata0-master: type=disk, path=$dir/disk.img, mode=flat, cylinders=2, heads=16, spt=63
boot: disk
display_library: nogui
port_e9_hack: enabled=1
log: $dir/bochs.log
panic: action=fatal
error: action=report
info: action=ignore
RC
timeout 240 "$FLEXC_BOCHS" -q -f "$dir/bochsrc" > "$dir/out.txt" 2>&1
verdict=$(grep -a -E '^(PASS|FAIL|SKIP)' "$dir/out.txt")
case "$verdict" in
PASS*) echo "$verdict"; exit 0 ;;
SKIP*) echo "skipped: $verdict (is Bochs configured with --enable-amx?)"; exit 77 ;;
FAIL*) echo "$verdict"; exit 1 ;;
esac
echo "FAIL: the guest gave no verdict; Bochs said:"
tail -n 20 "$dir/out.txt"
tail -n 20 "$dir/bochs.log"
exit 1
