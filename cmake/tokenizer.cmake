# tokenizer: the helper the Python scripts drive, the live parity test against Hugging Face
# `tokenizers` (skipped when it is not installed), and the libFuzzer target.

# Encodes texts to JSON and times encoding (see bench/tokenizer_parity.py, bench/tokenizer_vs_hf.py).
add_executable(tokenizer_tool ${PROJECT_SOURCE_DIR}/tests/tokenizer_tool.c)
target_link_libraries(tokenizer_tool PRIVATE flexc_internal)
find_program(FLEXC_TOK_PYTHON3 python3)
if(FLEXC_TOK_PYTHON3)
  add_test(NAME tokenizer_python_parity
           COMMAND ${FLEXC_TOK_PYTHON3} ${PROJECT_SOURCE_DIR}/bench/tokenizer_parity.py
                   --tool $<TARGET_FILE:tokenizer_tool> --seed 1 --random 2000)
else()
  add_test(NAME tokenizer_python_parity COMMAND sh -c "echo 'python3 not found: skipped'; exit 77")
endif()
# 77: python3 or its tokenizers package is missing.
set_tests_properties(tokenizer_python_parity PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)

if(FLEXC_FUZZ)
  # The tokenizer and what it calls; fixtures are read from the working directory, as
  # scripts/fuzz.sh runs it. No matrix products or tensor checks in a tokenizer (they need
  # the safetensors dtypes), and no device backend.
  flexc_add_fuzzer(fuzz_tokenizer ${PROJECT_SOURCE_DIR}/src/tokenizer/fuzz/fuzz_tokenizer.c "/src/(core|tokenizer)/"
                   "/src/core/(gemm|gemv|finite|backend)")
endif()
