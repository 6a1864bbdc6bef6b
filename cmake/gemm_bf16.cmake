# test_gemm_bf16 and test_model also run the vdpbf16ps (AVX512-BF16) micro-kernel built from
# SIMDe's portable intrinsics (tests/gemm_bf16_simde.c), so that its code is tested on CPUs
# without the instruction; scripts/deps.sh installs SIMDe (Debian's libsimde-dev).
include(CheckIncludeFile)
check_include_file(simde/x86/avx512.h FLEXC_HAVE_SIMDE)
if(FLEXC_HAVE_SIMDE)
  foreach(t test_gemm_bf16 test_model test_lce) # test_model: a bf16 step on that path; test_lce: the loss
    target_sources(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests/gemm_bf16_simde.c)
    target_compile_definitions(${t} PRIVATE FXT_HAVE_SIMDE)
  endforeach()
  # test_attention_backward: the attention's bfloat16 backward on the same portable intrinsics.
  target_sources(test_attention_backward PRIVATE ${PROJECT_SOURCE_DIR}/tests/attention_bf16_simde.c)
  target_compile_definitions(test_attention_backward PRIVATE FXT_HAVE_SIMDE)
  # SIMDe passes 64-byte vectors by value, about which GCC notes an old ABI change.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/tests/gemm_bf16_simde.c
                              ${PROJECT_SOURCE_DIR}/tests/attention_bf16_simde.c PROPERTIES COMPILE_OPTIONS -Wno-psabi)
else()
  message(WARNING "SIMDe not found (Debian: libsimde-dev): test_gemm_bf16 will not test the AVX512-BF16 kernel on this CPU")
endif()

# The bf16 GEMM against the float32 one (bench/gemm_bf16.c; not a test).
add_executable(bench_gemm_bf16 ${PROJECT_SOURCE_DIR}/bench/gemm_bf16.c)
target_link_libraries(bench_gemm_bf16 PRIVATE flexc_internal)

# The float32 GEMM's thin path against its tiled one at a LoRA step's shapes (bench/gemm_thin.c).
add_executable(bench_gemm_thin ${PROJECT_SOURCE_DIR}/bench/gemm_thin.c)
target_link_libraries(bench_gemm_thin PRIVATE flexc_internal)

# The bf16 GEMM against oneDNN's bfloat16 matmul (bench/gemm_bf16_onednn.c), where oneDNN is
# installed (Debian: libdnnl-dev; scripts/deps.sh ci installs it), in builds with OpenMP (the
# benchmark sets both libraries' thread counts through it).
find_library(FLEXC_DNNL_LIBRARY dnnl)
check_include_file(oneapi/dnnl/dnnl.h FLEXC_HAVE_DNNL_H)
if(FLEXC_DNNL_LIBRARY AND FLEXC_HAVE_DNNL_H AND FLEXC_OPENMP AND NOT FLEXC_SANITIZE AND NOT FLEXC_FUZZ)
  add_executable(bench_gemm_bf16_onednn ${PROJECT_SOURCE_DIR}/bench/gemm_bf16_onednn.c)
  target_link_libraries(bench_gemm_bf16_onednn PRIVATE flexc_internal ${FLEXC_DNNL_LIBRARY} OpenMP::OpenMP_C)
endif()

# The GPU bundle (make build-gpu, scripts/gpu-check.sh) carries both, statically linked, to
# measure and test the vdpbf16ps path on the GPU machine's CPU.
if(FLEXC_HAVE_CUDA AND FLEXC_GPU_PORTABLE)
  add_executable(test_gemm_bf16_portable ${PROJECT_SOURCE_DIR}/tests/test_gemm_bf16.c)
  add_executable(bench_gemm_bf16_portable ${PROJECT_SOURCE_DIR}/bench/gemm_bf16.c)
  if(FLEXC_HAVE_SIMDE)
    target_sources(test_gemm_bf16_portable PRIVATE ${PROJECT_SOURCE_DIR}/tests/gemm_bf16_simde.c)
    target_compile_definitions(test_gemm_bf16_portable PRIVATE FXT_HAVE_SIMDE)
  endif()
  foreach(t test_gemm_bf16_portable bench_gemm_bf16_portable)
    target_link_libraries(${t} PRIVATE ${fx_gpu_link})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
                               ${PROJECT_SOURCE_DIR}/tests)
  endforeach()
endif()

# The library's own AVX512-BF16 micro-kernel on an emulated CPU that has vdpbf16ps
# (tests/gemm_bf16_emu.py: Bochs's CPU emulator, PyPI's bochscpu-python, which CI installs;
# skipped without it): the object file of src/core/gemm_bf16_avx512bf16.c, as built into the
# library, linked alone with tests/gemm_bf16_emu_entry.S, without libc. Not in the sanitizer
# and fuzz builds, whose objects call their runtimes.
if(NOT FLEXC_SANITIZE AND NOT FLEXC_FUZZ AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  enable_language(ASM)
  add_executable(gemm_bf16_kernel_elf ${PROJECT_SOURCE_DIR}/tests/gemm_bf16_emu_entry.S
                 ${PROJECT_SOURCE_DIR}/tests/freestanding_mem.S
                 $<FILTER:$<TARGET_OBJECTS:flexc_obj>,INCLUDE,gemm_bf16_avx512bf16>)
  set_target_properties(gemm_bf16_kernel_elf PROPERTIES OUTPUT_NAME gemm_bf16_kernel.elf LINKER_LANGUAGE C)
  target_link_options(gemm_bf16_kernel_elf PRIVATE -nostdlib -static -no-pie -Wl,-e,fxt_entry)
  find_program(FLEXC_PYTHON3 python3)
  if(FLEXC_PYTHON3)
    add_test(NAME test_gemm_bf16_emu
             COMMAND ${FLEXC_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/gemm_bf16_emu.py $<TARGET_FILE:gemm_bf16_kernel_elf>)
  else()
    add_test(NAME test_gemm_bf16_emu COMMAND sh -c "echo 'python3 not found: skipped'; exit 77")
  endif()
  set_tests_properties(test_gemm_bf16_emu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()

# The library's AMX-BF16 micro-kernel on a whole emulated machine (tests/amx_guest: a boot
# sector, 64-bit mode, the object of src/core/gemm_bf16_amx.c as built into the library, and
# checks against float64 sums, all without libc), run by tests/gemm_bf16_amx_bochs.sh on Bochs
# 2.8 or later configured with --enable-amx, named by FLEXC_BOCHS; skipped without it (the
# emulator in PyPI's bochscpu-python has no AMX, and Debian's Bochs is older).
if(NOT FLEXC_SANITIZE AND NOT FLEXC_FUZZ AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(guest ${PROJECT_SOURCE_DIR}/tests/amx_guest)
  add_executable(gemm_bf16_amx_guest ${guest}/boot.S ${guest}/guest.c ${PROJECT_SOURCE_DIR}/tests/freestanding_mem.S
                 $<FILTER:$<TARGET_OBJECTS:flexc_obj>,INCLUDE,gemm_bf16_amx>)
  target_include_directories(gemm_bf16_amx_guest PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
  set_target_properties(gemm_bf16_amx_guest PROPERTIES OUTPUT_NAME gemm_bf16_amx_guest.elf LINKER_LANGUAGE C
                        POSITION_INDEPENDENT_CODE OFF LINK_DEPENDS ${guest}/amx_guest.ld)
  set_source_files_properties(${guest}/guest.c PROPERTIES COMPILE_OPTIONS
                              "-ffreestanding;-fno-builtin;-mno-red-zone;-fno-stack-protector;-fno-pie")
  target_link_options(gemm_bf16_amx_guest PRIVATE -nostdlib -static -no-pie -Wl,-T,${guest}/amx_guest.ld
                      -Wl,--no-warn-rwx-segments -Wl,--build-id=none)
  add_test(NAME test_gemm_bf16_amx_bochs
           COMMAND sh ${PROJECT_SOURCE_DIR}/tests/gemm_bf16_amx_bochs.sh $<TARGET_FILE:gemm_bf16_amx_guest>)
  set_tests_properties(test_gemm_bf16_amx_bochs PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
