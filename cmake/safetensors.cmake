# safetensors: jansson is required (the header parser), the libFuzzer target, and the optional
# interoperability test against the Python `safetensors` package.

if(NOT JANSSON_FOUND)
  message(FATAL_ERROR "flexc needs jansson (Debian: libjansson-dev; scripts/deps.sh installs it)")
endif()

# Reads and writes files the way the Python package checks them (see bench/safetensors_interop.py).
add_executable(safetensors_interop ${PROJECT_SOURCE_DIR}/tests/safetensors_interop.c)
target_link_libraries(safetensors_interop PRIVATE flexc_internal)
find_program(FLEXC_PYTHON3 python3)
if(FLEXC_PYTHON3)
  add_test(NAME safetensors_python_interop
           COMMAND ${FLEXC_PYTHON3} ${PROJECT_SOURCE_DIR}/bench/safetensors_interop.py
                   $<TARGET_FILE:safetensors_interop>)
else()
  add_test(NAME safetensors_python_interop COMMAND sh -c "echo 'python3 not found: skipped'; exit 77")
endif()
# 77: python3 or its safetensors package is missing.
set_tests_properties(safetensors_python_interop PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)

if(FLEXC_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FLEXC_FUZZ needs clang (CC=clang)")
  endif()
  # The parser and what it calls, instrumented for coverage, ASan and UBSan; the rest of the
  # library is not needed by this target.
  set(FLEXC_FUZZ_SANITIZE -fsanitize=address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -g)
  set(fx_st_fuzz_sources ${FLEXC_LIB_SOURCES})
  list(FILTER fx_st_fuzz_sources INCLUDE REGEX "/src/(core|safetensors)/")
  add_library(fx_st_fuzz_obj OBJECT ${fx_st_fuzz_sources})
  target_include_directories(fx_st_fuzz_obj PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(fx_st_fuzz_obj PRIVATE -fsanitize=fuzzer-no-link ${FLEXC_FUZZ_SANITIZE})
  target_link_libraries(fx_st_fuzz_obj PUBLIC ${FLEXC_DEPS})
  add_executable(fuzz_safetensors ${PROJECT_SOURCE_DIR}/src/safetensors/fuzz/fuzz_safetensors.c
                 $<TARGET_OBJECTS:fx_st_fuzz_obj>)
  target_include_directories(fuzz_safetensors PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer ${FLEXC_FUZZ_SANITIZE})
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer ${FLEXC_FUZZ_SANITIZE})
  target_link_libraries(fuzz_safetensors PRIVATE ${FLEXC_DEPS})
endif()
