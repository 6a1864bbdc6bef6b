// The attention kernels compiled for the CPU emulation (src/cuda/emu.h).
#include "cuda/attention.cu"
