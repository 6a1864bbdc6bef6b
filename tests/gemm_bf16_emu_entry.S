/* The entry of tests/gemm_bf16_emu.py's guest program: the library's AVX512-BF16 micro-kernel
   (the object of src/core/gemm_bf16_avx512bf16.c) linked alone with this file, without libc,
   and run on an emulated CPU. The harness writes a request at FXT_REQ and starts here:
     +0  command: 0 = call the kernel, 1 = cpuid
     kernel: +8 K2, +16 a, +24 b, +32 beta (float), +40 C, +48 ldc, +56 mr, +64 nr
     cpuid:  +8 leaf, +16 subleaf; eax, ebx, ecx, edx written back at +72, +76, +80, +84
   then halts. memcpy and memset come from tests/freestanding_mem.S. */
    .set FXT_REQ, 0x20000000
    .text
    .globl fxt_entry
fxt_entry:
    movabs $FXT_REQ, %rax
    cmpq $1, 0(%rax)
    je 1f
    mov 8(%rax), %rdi
    mov 16(%rax), %rsi
    mov 24(%rax), %rdx
    movss 32(%rax), %xmm0
    mov 40(%rax), %rcx
    mov 48(%rax), %r8
    mov 56(%rax), %r9
    sub $8, %rsp            /* the call's stack 16-byte aligned with one argument on it */
    pushq 64(%rax)
    call fx__bf16_dp_kernel_avx512bf16
    add $16, %rsp
    hlt
1:  mov %rax, %rsi
    mov 8(%rsi), %eax
    mov 16(%rsi), %ecx
    cpuid
    mov %eax, 72(%rsi)
    mov %ebx, 76(%rsi)
    mov %ecx, 80(%rsi)
    mov %edx, 84(%rsi)
    hlt

    .section .note.GNU-stack,"",@progbits
