/* The training step's host side (src/cuda/model_gpu.c) compiled against the CPU emulation
   (src/cuda/emu.h). */
#include "cuda/model_gpu.c"
