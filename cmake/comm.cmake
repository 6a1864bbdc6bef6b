# The communication layer (src/comm, include/flexc/comm.h).
#
# Without MPI the library gets a stub whose functions return FX_EUNSUPPORTED (the top-level
# glob leaves src/comm/ out in that case), tested by tests/nompi_comm.c. With MPI, tests/mpi_comm.c runs its cases under
# mpirun with 2 (and 3, 4) processes; tests/test_comm.c is the 1-process run of the generic loop.
if(NOT FLEXC_HAVE_MPI)
  target_sources(flexc_obj PRIVATE ${PROJECT_SOURCE_DIR}/src/comm/comm_stub.c ${PROJECT_SOURCE_DIR}/src/comm/common.c)
  add_executable(nompi_comm ${PROJECT_SOURCE_DIR}/tests/nompi_comm.c)
  target_link_libraries(nompi_comm PRIVATE flexc_internal)
  target_include_directories(nompi_comm PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME nompi_comm COMMAND nompi_comm)
  set_tests_properties(nompi_comm PROPERTIES TIMEOUT 60)
  return()
endif()

add_executable(mpi_comm ${PROJECT_SOURCE_DIR}/tests/mpi_comm.c)
target_link_libraries(mpi_comm PRIVATE flexc_internal MPI::MPI_C)
target_include_directories(mpi_comm PRIVATE ${PROJECT_SOURCE_DIR}/tests)

# Open MPI leaves allocations behind at exit; LeakSanitizer is told to ignore those. Its stacks
# through libmpi need the slow unwinder (no frame pointers there), and MPI's plugins must stay
# mapped at exit (disable_dlclose) for the suppressions to match them by name.
set(FLEXC_COMM_TEST_ENV
    "FLEXC_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    "FLEXC_BUILD_DIR=${PROJECT_BINARY_DIR}"
    "ASAN_OPTIONS=fast_unwind_on_malloc=0"
    "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0"
    "OMPI_MCA_mca_base_component_disable_dlclose=1"
    "OMP_NUM_THREADS=1")
set_property(TEST test_comm APPEND PROPERTY ENVIRONMENT ${FLEXC_COMM_TEST_ENV})

set(FLEXC_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
foreach(case collectives timeout mismatch)
  add_test(NAME mpi_comm_${case} COMMAND ${FLEXC_MPIRUN} -np 2 $<TARGET_FILE:mpi_comm> ${case})
  set_tests_properties(mpi_comm_${case} PROPERTIES TIMEOUT 60 ENVIRONMENT "${FLEXC_COMM_TEST_ENV}")
endforeach()
# 3 ranks: not a power of two; 4 ranks: the deterministic sum's tree has two levels.
foreach(np 3 4)
  add_test(NAME mpi_comm_collectives_np${np} COMMAND ${FLEXC_MPIRUN} -np ${np} $<TARGET_FILE:mpi_comm> collectives)
  set_tests_properties(mpi_comm_collectives_np${np} PROPERTIES TIMEOUT 60 ENVIRONMENT "${FLEXC_COMM_TEST_ENV}")
endforeach()
# A rank killed with SIGKILL: the survivor must come back with an error, not hang.
add_test(NAME mpi_comm_killed
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/mpi_comm_kill.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:mpi_comm>)
set_tests_properties(mpi_comm_killed PROPERTIES TIMEOUT 90 ENVIRONMENT "${FLEXC_COMM_TEST_ENV}")

# The layer's cost over plain MPI (not a test: it reports; docs/comm.md):
#   mpirun -np 2 build/comm_bench [--json]
add_executable(comm_bench ${PROJECT_SOURCE_DIR}/bench/comm_bench.c)
target_link_libraries(comm_bench PRIVATE flexc_internal MPI::MPI_C)
