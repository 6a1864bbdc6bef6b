# test_gemm_bf16 also runs the vdpbf16ps (AVX512-BF16) micro-kernel built from SIMDe's portable
# intrinsics (tests/gemm_bf16_simde.c), so that its code is tested on CPUs without the
# instruction; scripts/deps.sh installs SIMDe (Debian's libsimde-dev).
include(CheckIncludeFile)
check_include_file(simde/x86/avx512.h FLEXC_HAVE_SIMDE)
if(FLEXC_HAVE_SIMDE)
  target_sources(test_gemm_bf16 PRIVATE ${PROJECT_SOURCE_DIR}/tests/gemm_bf16_simde.c)
  target_compile_definitions(test_gemm_bf16 PRIVATE FXT_HAVE_SIMDE)
  # SIMDe passes 64-byte vectors by value, about which GCC notes an old ABI change.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/tests/gemm_bf16_simde.c PROPERTIES COMPILE_OPTIONS -Wno-psabi)
else()
  message(WARNING "SIMDe not found (Debian: libsimde-dev): test_gemm_bf16 will not test the AVX512-BF16 kernel on this CPU")
endif()

# The bf16 GEMM against the float32 one (bench/gemm_bf16.c; not a test).
add_executable(bench_gemm_bf16 ${PROJECT_SOURCE_DIR}/bench/gemm_bf16.c)
target_link_libraries(bench_gemm_bf16 PRIVATE flexc_internal)

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
