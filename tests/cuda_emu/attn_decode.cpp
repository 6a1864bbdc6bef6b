// The decoding kernels compiled for the CPU emulation (src/cuda/emu.h).
#include "cuda/attn_decode.cu"
