// The fused-loss kernels compiled for the CPU emulation (src/cuda/emu.h).
#include "cuda/lce.cu"
