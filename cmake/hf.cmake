# hf: the libFuzzer target of the Hugging Face configuration parser (config.json and
# generation_config.json come with every downloaded checkpoint).

if(FLEXC_FUZZ)
  # The parser and writer, the model configuration's check and field table, and the core
  # helpers they call.
  flexc_add_fuzzer(fuzz_hf_config ${PROJECT_SOURCE_DIR}/src/hf/fuzz/fuzz_hf_config.c
                   "/src/(core/(error|alloc|file)|hf/config|model/config)\\.c$")
endif()
