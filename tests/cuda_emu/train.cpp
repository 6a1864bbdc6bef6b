// The training step's layer kernels compiled for the CPU emulation (src/cuda/emu.h).
#include "cuda/train.cu"
