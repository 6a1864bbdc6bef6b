// The tensor-core attention forward compiled for the CPU emulation (src/cuda/emu.h).
#include "cuda/attn_fwd_tc.cu"
