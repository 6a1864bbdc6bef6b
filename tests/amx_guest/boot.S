/* A bare machine's start for tests/amx_guest: a PC BIOS loads the first sector at 0x7C00; it
   reads the rest of the image after itself (int 13h, LBA), enters 64-bit mode with the first
   GiB identity-mapped by 2 MiB pages, enables SSE, AVX, AVX-512 and the AMX tile state in
   XCR0 (as far as CPUID offers them), calls fxt_guest_main and asks the emulator to shut down
   (Bochs's port 0x8900). A CPU exception calls fxt_guest_exception and shuts down the same
   way. Everything is linked at its load address (amx_guest.ld). */
    .set PML4, 0x70000          /* page tables: PML4, PDPT, PD, one page each */
    .set STACK_TOP, 0x90000

    .code16
    .section .boot, "ax"
    .globl fxt_boot
fxt_boot:
    cli
    xor %ax, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov $0x7C00, %sp
    mov $dap, %si               /* dl: the boot drive, from the BIOS */
    mov $0x42, %ah
    int $0x13
    jc 1f
    cli                         /* the BIOS may have enabled interrupts: mask the PICs */
    mov $0xFF, %al
    out %al, $0xA1
    out %al, $0x21
    in $0x92, %al               /* A20 on */
    or $2, %al
    and $0xFE, %al
    out %al, $0x92
    lgdt gdt_ptr
    mov %cr0, %eax
    or $1, %eax
    mov %eax, %cr0
    ljmp $0x08, $protected
1:  mov $'!', %al               /* the read failed: say so and stop */
    out %al, $0xE9
    hlt
    jmp 1b

    .p2align 3
gdt:
    .quad 0
    .quad 0x00CF9A000000FFFF    /* 0x08: 32-bit code */
    .quad 0x00CF92000000FFFF    /* 0x10: data */
    .quad 0x00AF9A000000FFFF    /* 0x18: 64-bit code */
gdt_ptr:
    .word gdt_ptr - gdt - 1
    .long gdt
dap:                            /* int 13h AH=42h: the sectors after this one, to 0x7E00 */
    .byte 16, 0
    .word fxt_sectors
    .word 0x7E00, 0
    .quad 1

    .code32
    .section .text.boot, "ax"  /* past the first sector: loaded by the read above */
protected:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov $PML4, %edi             /* zero three pages, then link PML4 -> PDPT -> PD */
    xor %eax, %eax
    mov $3 * 1024, %ecx
    rep stosl
    movl $PML4 + 0x1003, PML4
    movl $PML4 + 0x2003, PML4 + 0x1000
    mov $PML4 + 0x2000, %edi
    mov $0x83, %eax             /* present, writable, 2 MiB page */
    mov $512, %ecx
2:  mov %eax, (%edi)
    add $0x200000, %eax
    add $8, %edi
    loop 2b
    mov %cr4, %eax
    or $1 << 5, %eax            /* PAE */
    mov %eax, %cr4
    mov $PML4, %eax
    mov %eax, %cr3
    mov $0xC0000080, %ecx       /* EFER.LME */
    rdmsr
    or $1 << 8, %eax
    wrmsr
    mov %cr0, %eax
    or $1 << 31, %eax           /* paging: long mode */
    mov %eax, %cr0
    ljmp $0x18, $long64

    .code64
long64:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov $STACK_TOP, %rsp
    mov %cr0, %rax
    and $~(1 << 2), %rax        /* EM off */
    or $1 << 1, %rax            /* MP on */
    mov %rax, %cr0
    mov %cr4, %rax
    or $(1 << 9) | (1 << 10) | (1 << 18), %rax  /* OSFXSR, OSXMMEXCPT, OSXSAVE */
    mov %rax, %cr4
    mov $0xD, %eax              /* XCR0 = what CPUID offers of x87, SSE, AVX, AVX-512, AMX */
    xor %ecx, %ecx
    cpuid
    and $0x600E7, %eax
    xor %edx, %edx
    xor %ecx, %ecx
    xsetbv
    mov $fxt_bss_start, %rdi    /* zero .bss */
    mov $fxt_bss_end, %rcx
    sub %rdi, %rcx
    xor %eax, %eax
    rep stosb
    lea idt(%rip), %rdi         /* the IDT: vectors 0-31 to the stubs below */
    lea stubs(%rip), %rsi
    xor %ecx, %ecx
4:  mov %rsi, %rax
    mov %ax, (%rdi)             /* offset 15:0 */
    movw $0x18, 2(%rdi)         /* the 64-bit code segment */
    movw $0x8E00, 4(%rdi)       /* present, interrupt gate */
    shr $16, %rax
    mov %ax, 6(%rdi)            /* offset 31:16 */
    shr $16, %rax
    mov %eax, 8(%rdi)           /* offset 63:32 */
    movl $0, 12(%rdi)
    add $16, %rdi
    add $stub_size, %rsi
    inc %ecx
    cmp $32, %ecx
    jb 4b
    lidt idt_ptr(%rip)
    call fxt_guest_main
shut_down:
    mov $shutdown, %rsi         /* Bochs quits on "Shutdown" written to port 0x8900 */
    mov $8, %ecx
    mov $0x8900, %dx
    rep outsb
3:  cli
    hlt
    jmp 3b

    /* One stub per vector, all of one size: the vector into edi, then the common part. */
    .set stub_size, 16
    .balign stub_size
stubs:
    .rept 32
    .balign stub_size
    mov $(. - stubs) / stub_size, %edi
    jmp exception
    .endr
exception:
    mov %rsp, %rsi              /* the frame: the error code (some vectors), then rip */
    and $~15, %rsp
    call fxt_guest_exception
    jmp shut_down

    .section .rodata
idt_ptr:
    .word 32 * 16 - 1
    .quad idt
shutdown:
    .ascii "Shutdown"

    .section .bss
    .balign 16
idt:
    .skip 32 * 16

    .section .note.GNU-stack,"",@progbits
