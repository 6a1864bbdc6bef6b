#!/usr/bin/env python3
"""The library's compiled AVX512-BF16 micro-kernel, run on an emulated CPU that has vdpbf16ps.

    python3 tests/gemm_bf16_emu.py build/gemm_bf16_kernel.elf

The ELF is the object file of src/core/gemm_bf16_avx512bf16.c, as built into the library,
linked alone with tests/gemm_bf16_emu_entry.S (no libc). Bochs's CPU emulator (the PyPI
package bochscpu-python) runs it in 64-bit mode as a Sapphire Rapids CPU, whose CPUID the
test first checks for AVX512-BF16. Each call of fx__bf16_dp_kernel_avx512bf16 gets random
packed panels; its tile of C must match the float64 sums of the same bfloat16 products within
test_gemm_bf16.c's tolerance, 1e-5 * (sum |a b| + |beta c|), beta 0 must overwrite NaN, and
nothing outside the mr x nr tile may change. (The AMX kernel, gemm_bf16_amx.c, runs in
tests/amx_guest instead: bochscpu-python's Bochs is built without AMX's instructions.)

Exit status: 0 passed, 1 failed, 77 skipped (bochscpu-python is not installed; CI installs it).
"""
import ctypes
import math
import random
import struct
import sys

try:
    import bochscpu
    import bochscpu.cpu
    import bochscpu.memory
except ImportError as e:
    print(f"skipped: bochscpu-python is not installed ({e}); pip install bochscpu-python==0.3.1")
    sys.exit(77)

MR, NR = 12, 32                  # the micro-kernel's tile (gemm_bf16.h: FX__DP_MR, FX__DP_NR)
REQ = 0x2000_0000                # the request block (gemm_bf16_emu_entry.S: FXT_REQ)
DATA, DATA_BYTES = 0x3000_0000, 1 << 20
STACK = 0x4000_0000
PAGE = bochscpu.memory.page_size()

# Bochs's CPU models, in the order of its cpudb: bochscpu-python 0.3.1 names the first 28
# (tigerlake, 27, is its default); 28 is sapphire_rapids, which has AVX512-BF16 and AMX.
SAPPHIRE_RAPIDS = 28


def select_cpu_model(index):
    """Sets Bochs's `cpu.model` parameter; takes effect when the first CPU is created."""
    lib = ctypes.CDLL(bochscpu._bochscpu.__file__)
    lib.sim_get_param_enum.restype = ctypes.c_void_p
    lib.sim_get_param_enum.argtypes = [ctypes.c_char_p]
    set_index = getattr(lib, "_ZN15bx_param_enum_c3setEl")  # bx_param_enum_c::set(Bit64s)
    set_index.argtypes = [ctypes.c_void_p, ctypes.c_long]
    set_index(lib.sim_get_param_enum(b"cpu.model"), index)


def elf_segments(path):
    """(entry, [(vaddr, bytes, memsz)]) of a static ELF64's loadable segments."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"{path}: not an ELF64 file")
    entry, phoff = struct.unpack_from("<QQ", data, 0x18)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segs = []
    for i in range(phnum):
        ptype, _, off, vaddr, _, filesz, memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if ptype == 1:  # PT_LOAD
            segs.append((vaddr, data[off:off + filesz], memsz))
    return entry, segs


class Guest:
    """One emulated CPU in 64-bit ring 0, the program's pages, a request block, a data area
    and a stack, all identity-mapped."""

    def __init__(self, elf):
        self.entry, segs = elf_segments(elf)
        self.sess = bochscpu.Session()
        self.sess.missing_page_handler = self._missing_page
        # The table owns the pages it commits: it lives as long as the guest.
        self.table = table = bochscpu.memory.PageMapLevel4Table()
        ranges = [(v, v + m) for v, _, m in segs]
        ranges += [(REQ, REQ + PAGE), (DATA, DATA + DATA_BYTES), (STACK - 8 * PAGE, STACK)]
        mapped = set()
        for lo, hi in ranges:
            for page in range(lo & ~(PAGE - 1), hi, PAGE):
                if page not in mapped:
                    bochscpu.memory.page_insert(page, bochscpu.memory.allocate_host_page())
                    table.insert(page, page, 1)  # read, write, execute
                    mapped.add(page)
        self.pml4 = 0x10_0000
        for hva, gpa in table.commit(self.pml4):
            bochscpu.memory.page_insert(gpa, hva)
        for vaddr, data, memsz in segs:
            self.write(vaddr, data + bytes(memsz - len(data)))

    @staticmethod
    def _missing_page(gpa):
        raise RuntimeError(f"the guest touched unmapped memory at {gpa:#x}")

    def write(self, addr, data):
        if not bochscpu.memory.virt_write(self.pml4, addr, bytearray(data)):
            raise RuntimeError(f"cannot write guest memory at {addr:#x}")

    def read(self, addr, n):
        return bytes(bochscpu.memory.virt_read(self.pml4, addr, n))

    def run(self, request):
        """Writes the request, runs from the entry to its hlt; an exception fails the run."""
        self.write(REQ, request)
        st = bochscpu.State()
        bochscpu.cpu.set_long_mode(st)
        st.cr3 = self.pml4
        st.cr0 = (st.cr0 | 0x2) & ~0x4                      # MP on, EM off: SSE and AVX
        st.cr4 = st.cr4 | (1 << 9) | (1 << 10) | (1 << 18)  # OSFXSR, OSXMMEXCPT, OSXSAVE
        st.xcr0 = 0xE7                                      # x87, SSE, AVX, opmask, ZMM state
        st.mxcsr, st.fpcw = 0x1F80, 0x037F                  # as at a program's start: exceptions masked
        st.rsp, st.rip = STACK, self.entry
        code, data = bochscpu.Segment(), bochscpu.Segment()
        code.present, code.selector, code.base, code.limit, code.attr = True, 0x10, 0, 0xFFFFFFFF, 0x209B
        data.present, data.selector, data.base, data.limit, data.attr = True, 0x18, 0, 0xFFFFFFFF, 0xC093
        st.cs = code
        st.ds = st.ss = st.es = st.fs = st.gs = data
        self.sess.cpu.state = st
        stop = {}

        def on_exception(sess, cpu, vector, error):
            stop["exception"] = (int(vector), int(error))
            sess.stop()

        def on_hlt(sess, cpu):
            stop["hlt"] = True
            sess.stop()

        hook = bochscpu.Hook()
        hook.exception, hook.hlt = on_exception, on_hlt
        self.sess.run([hook])
        if "hlt" not in stop:
            raise RuntimeError(f"the guest stopped on exception {stop.get('exception')} at {self.sess.cpu.state.rip:#x}")

    def cpuid(self, leaf, subleaf=0):
        self.run(struct.pack("<QQQ", 1, leaf, subleaf))
        return struct.unpack("<IIII", self.read(REQ + 72, 16))


def bf16(x):
    """x rounded to bfloat16 (nearest even), as its 16 bits."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def f32(bits16):
    return struct.unpack("<f", struct.pack("<I", (bits16 & 0xFFFF) << 16))[0]


def check_tile(g, rng, K2, mr, nr, ldc, beta):
    """One kernel call; returns the largest error relative to its bound, or raises."""
    a = [bf16(rng.uniform(-1, 1)) | bf16(rng.uniform(-1, 1)) << 16 for _ in range(K2 * MR)]
    b = [bf16(rng.uniform(-1, 1)) | bf16(rng.uniform(-1, 1)) << 16 for _ in range(K2 * NR)]
    rows = mr + 1                       # one row past the tile: it must stay as it was
    c0 = [rng.uniform(-1, 1) for _ in range(rows * ldc)]
    if beta == 0.0:                     # beta 0 overwrites, NaN included
        c0 = [math.nan if r < mr and j < nr else c0[r * ldc + j] for r in range(rows) for j in range(ldc)]
    pa, pb, pc = DATA, DATA + 4 * len(a), DATA + 4 * (len(a) + len(b))
    assert pc + 4 * len(c0) <= DATA + DATA_BYTES
    g.write(pa, struct.pack(f"<{len(a)}I", *a))
    g.write(pb, struct.pack(f"<{len(b)}I", *b))
    g.write(pc, struct.pack(f"<{len(c0)}f", *c0))
    g.run(struct.pack("<QQQQfIQQQQ", 0, K2, pa, pb, beta, 0, pc, ldc, mr, nr))
    c = struct.unpack(f"<{len(c0)}f", g.read(pc, 4 * len(c0)))
    c0_bits = struct.pack(f"<{len(c0)}f", *c0)
    worst = 0.0
    for r in range(rows):
        for j in range(ldc):
            i = r * ldc + j
            if r >= mr or j >= nr:
                if c0_bits[4 * i:4 * i + 4] != struct.pack("<f", c[i]):
                    raise AssertionError(f"K2 {K2} mr {mr} nr {nr} ldc {ldc}: C[{r}][{j}] outside the tile changed")
                continue
            acc = mag = 0.0
            for p in range(K2):
                wa, wb = a[p * MR + r], b[p * NR + j]
                for h in (0, 16):
                    prod = f32(wa >> h) * f32(wb >> h)
                    acc += prod
                    mag += abs(prod)
            base = 0.0 if beta == 0.0 else beta * c0[i]
            err, bound = abs(c[i] - (acc + base)), 1e-5 * (mag + abs(base)) + 1e-30
            if not err <= bound:
                raise AssertionError(f"K2 {K2} mr {mr} nr {nr} ldc {ldc} beta {beta}: C[{r}][{j}] = {c[i]!r}, "
                                     f"want {acc + base!r} (error {err:.3g}, bound {bound:.3g})")
            worst = max(worst, err / bound)
    return worst


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: gemm_bf16_emu.py GEMM_BF16_KERNEL_ELF")
    select_cpu_model(SAPPHIRE_RAPIDS)
    g = Guest(sys.argv[1])
    brand = b"".join(struct.pack("<IIII", *g.cpuid(leaf)) for leaf in (0x80000002, 0x80000003, 0x80000004))
    _, ebx7, _, _ = g.cpuid(7, 0)
    eax71, _, _, _ = g.cpuid(7, 1)
    print(f"emulated CPU: {brand.rstrip(bytes(1)).decode(errors='replace').strip()}")
    if not (ebx7 >> 16) & 1 or not (eax71 >> 5) & 1:
        print("FAIL: the emulated CPU reports no AVX512F or no AVX512-BF16: the kernel would not be tested")
        return 1
    rng = random.Random(1)
    # (K2, mr, nr, ldc): whole tiles, every tail of rows and of each vector, one pair, long K.
    shapes = [(1, 12, 32, 32), (5, 12, 32, 40), (64, 7, 32, 33), (129, 12, 17, 20), (3, 1, 1, 1),
              (257, 12, 16, 16), (33, 5, 9, 11), (2, 12, 31, 32)]
    worst, calls = 0.0, 0
    for K2, mr, nr, ldc in shapes:
        for beta in (0.0, 1.0, -0.5):
            try:
                worst = max(worst, check_tile(g, rng, K2, mr, nr, ldc, beta))
            except (AssertionError, RuntimeError) as e:
                print(f"FAIL: {e}")
                return 1
            calls += 1
    print(f"passed: {calls} calls of fx__bf16_dp_kernel_avx512bf16; largest error {worst:.3f} of its bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
