# flexc train over MPI processes (tests/mpi_train.sh, 2 ranks each, tiny model, a few
# seconds per case). Included after comm.cmake, whose FLEXC_MPIRUN and FLEXC_COMM_TEST_ENV
# it uses. Without MPI, --parallel must refuse clearly.
if(NOT FLEXC_HAVE_MPI)
  add_test(NAME train_parallel_unsupported
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/mpi_train.sh none $<TARGET_FILE:flexc> nompi)
  set_tests_properties(train_parallel_unsupported PROPERTIES TIMEOUT 30)
  return()
endif()

foreach(case ddp fsdp resume kill interrupt errors memory consistency mods)
  add_test(NAME mpi_train_${case}
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/mpi_train.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:flexc> ${case})
  set_tests_properties(mpi_train_${case} PROPERTIES TIMEOUT 90 LABELS mpi ENVIRONMENT "${FLEXC_COMM_TEST_ENV}")
endforeach()

# Fine-tuning Hugging Face models over MPI (tests/mpi_hf.sh: the tied Llama and the untied
# Qwen2 fixtures, 2 ranks each: about 5 s, 45 s under the sanitizers).
foreach(case ddp fsdp resume export lora)
  add_test(NAME mpi_hf_${case}
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/mpi_hf.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:flexc> ${case})
  set_tests_properties(mpi_hf_${case} PROPERTIES TIMEOUT 180 LABELS mpi ENVIRONMENT "${FLEXC_COMM_TEST_ENV}")
endforeach()

# The benchmark runs (its numbers are not checked: benchmarks report, tests assert).
add_test(NAME mpi_bench_train_fsdp
         COMMAND ${FLEXC_MPIRUN} -np 2 $<TARGET_FILE:flexc> bench train --parallel fsdp --model tiny --steps 1
                 --threads 1 --json)
set_tests_properties(mpi_bench_train_fsdp PROPERTIES TIMEOUT 60 ENVIRONMENT "${FLEXC_COMM_TEST_ENV}"
                     PASS_REGULAR_EXPRESSION "\"hidden_fraction\":-?[0-9.]+,.*\"allocated_bytes\":[0-9]+")
