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
  # The parser and what it calls (no device backend).
  flexc_add_fuzzer(fuzz_safetensors ${PROJECT_SOURCE_DIR}/src/safetensors/fuzz/fuzz_safetensors.c
                   "/src/(core|safetensors)/" "/src/core/backend")
endif()
