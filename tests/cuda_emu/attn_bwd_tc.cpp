// The tensor-core attention backward compiled for the CPU emulation (src/cuda/emu.h).
#include "cuda/attn_bwd_tc.cu"
