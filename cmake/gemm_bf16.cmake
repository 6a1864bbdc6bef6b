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
