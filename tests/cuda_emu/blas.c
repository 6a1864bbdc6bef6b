/* The products of src/cuda/blas.c as the CPU emulation builds them: a plain loop over host
   memory (src/cuda/emu.h). */
#include "cuda/blas.c"
