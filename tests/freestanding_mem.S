/* memcpy, memmove and memset for the test programs that run the library's kernels without
   libc on an emulated CPU (tests/gemm_bf16_emu_entry.S, tests/amx_guest): the kernels'
   objects call them for their tile copies. */
    .text
    .globl memcpy
memcpy:
    mov %rdi, %rax
    mov %rdx, %rcx
    rep movsb
    ret

    .globl memmove
memmove:
    mov %rdi, %rax
    mov %rdx, %rcx
    cmp %rsi, %rdi
    jbe 1f                      /* destination below the source: forwards is safe */
    lea -1(%rsi, %rcx), %rsi
    lea -1(%rdi, %rcx), %rdi
    std
    rep movsb
    cld
    ret
1:  rep movsb
    ret

    .globl memset
memset:
    mov %rdi, %r9
    mov %esi, %eax
    mov %rdx, %rcx
    rep stosb
    mov %r9, %rax
    ret

    .section .note.GNU-stack,"",@progbits
