# hf: the libFuzzer target of the Hugging Face configuration parser (config.json and
# generation_config.json come with every downloaded checkpoint).

if(FLEXC_FUZZ)
  # The parser and writer, and the core helpers they call.
  flexc_add_fuzzer(fuzz_hf_config ${PROJECT_SOURCE_DIR}/src/hf/fuzz/fuzz_hf_config.c
                   "/src/(core/(error|alloc|file)|hf/config)\\.c$")
endif()
