# LoRA: flexc's adapters as PEFT and transformers read them (tests/lora_peft_interop.py); skips
# (77) when torch, transformers or peft is missing.
find_program(FLEXC_PYTHON3 python3)
if(FLEXC_PYTHON3 AND NOT FLEXC_SANITIZE)
  add_test(NAME lora_peft_interop
           COMMAND ${FLEXC_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/lora_peft_interop.py $<TARGET_FILE:flexc>
                   $<TARGET_FILE:flexc_shared>)
else()
  add_test(NAME lora_peft_interop COMMAND sh -c "echo 'python3 not found (or a sanitizer build): skipped'; exit 77")
endif()
set_tests_properties(lora_peft_interop PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
