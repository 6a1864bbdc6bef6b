/* The CUDA backend's host side compiled against the CPU emulation (src/cuda/emu.h). */
#include "cuda/device.c"
