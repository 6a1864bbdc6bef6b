# CUDA backend (docs/cuda.md): FlexAttention and the fused loss on device memory.
#
#   -DFLEXC_CUDA=AUTO  (default) build it when a CUDA toolkit (nvcc, CUDA 12 or 13) is found
#   -DFLEXC_CUDA=ON    require it
#   -DFLEXC_CUDA=OFF   leave it out (the device entry points then return FX_EUNSUPPORTED)
#
# Code is generated for sm_90a (H100/H200) plus PTX for compute_80, which the driver compiles
# for any later GPU. The CUDA runtime is linked statically: libflexc loads and runs on a
# machine without a GPU or without the driver (libcuda.so.1 is opened at run time, and a
# missing one only makes fx_cuda_device_count() return 0).
#
# -DFLEXC_GPU_PORTABLE=ON additionally links the GPU test programs with static BLIS, libgomp
# and jansson, so that they run on a GPU machine that has none of those installed
# (scripts/gpu-check.sh).

set(FLEXC_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE FLEXC_CUDA PROPERTY STRINGS AUTO ON OFF)
option(FLEXC_GPU_PORTABLE "Link the GPU tests with static BLIS, OpenMP and jansson libraries" OFF)

set(FLEXC_HAVE_CUDA OFF)
if(NOT FLEXC_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND AND CUDAToolkit_VERSION_MAJOR GREATER_EQUAL 12)
      set(FLEXC_HAVE_CUDA ON)
    elseif(CUDAToolkit_FOUND)
      message(STATUS "flexc: CUDA ${CUDAToolkit_VERSION} is older than 12: CUDA backend off")
    endif()
  endif()
  if(FLEXC_CUDA STREQUAL "ON" AND NOT FLEXC_HAVE_CUDA)
    message(FATAL_ERROR "FLEXC_CUDA=ON but no CUDA toolkit >= 12 (nvcc) was found")
  endif()
endif()
message(STATUS "flexc: CUDA backend ${FLEXC_HAVE_CUDA}")

if(FLEXC_HAVE_CUDA)
  file(GLOB FLEXC_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cu)
  target_sources(flexc_obj PRIVATE ${FLEXC_CUDA_SOURCES})
  set_source_files_properties(${FLEXC_CUDA_SOURCES} PROPERTIES COMPILE_OPTIONS
    "-gencode=arch=compute_90a,code=sm_90a;-gencode=arch=compute_80,code=compute_80;-O3;-Xcompiler=-Wall,-Wextra,-Werror,-fvisibility=hidden;-Werror=all-warnings")
  set_target_properties(flexc_obj PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17)
  target_compile_definitions(flexc_obj PUBLIC FLEXC_HAVE_CUDA)
  target_include_directories(flexc_obj PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  foreach(t flexc_shared flexc_static)
    target_link_libraries(${t} PUBLIC CUDA::cudart_static)
  endforeach()
  target_compile_definitions(flexc_internal INTERFACE FLEXC_HAVE_CUDA)
  target_include_directories(flexc_internal INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  # The kernels' host code is C++ (nvcc): a static link needs its runtime too.
  string(APPEND FLEXC_PC_LIBS_EXTRA " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt -lpthread -lstdc++")
  set(PC_INCLUDEDIR ${PROJECT_SOURCE_DIR}/include)
  set(PC_LIBDIR ${PROJECT_BINARY_DIR})
  configure_file(${PROJECT_SOURCE_DIR}/flexc.pc.in ${PROJECT_BINARY_DIR}/flexc.pc @ONLY)
  set(PC_INCLUDEDIR ${CMAKE_INSTALL_FULL_INCLUDEDIR})
  set(PC_LIBDIR ${CMAKE_INSTALL_FULL_LIBDIR})
  configure_file(${PROJECT_SOURCE_DIR}/flexc.pc.in ${PROJECT_BINARY_DIR}/install/flexc.pc @ONLY)
endif()

# ---- GPU tests ------------------------------------------------------------------------------
# tests/test_cuda_gpu_*.c compare the device path with the CPU path of the same call; they
# exit 77 (skipped, with the reason printed) when no GPU is visible.
if(FLEXC_HAVE_CUDA)
  file(GLOB FLEXC_GPU_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/test_cuda_gpu_*.c)
  if(FLEXC_GPU_PORTABLE)
    # The library's objects without its shared dependencies, then static archives of them.
    add_library(flexc_gpu_static STATIC $<TARGET_OBJECTS:flexc_obj>)
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libgomp.a OUTPUT_VARIABLE fx_gomp_a
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    find_library(fx_blis_a NAMES libblis.a PATHS ${FLEXC_BLIS_LIBDIR} NO_DEFAULT_PATH REQUIRED)
    find_library(fx_jansson_a NAMES libjansson.a REQUIRED)
    set(fx_gpu_link flexc_gpu_static ${fx_blis_a} ${fx_gomp_a}
        ${fx_jansson_a} CUDA::cudart_static m pthread dl rt)
    target_compile_definitions(flexc_gpu_static PUBLIC FLEXC_HAVE_CUDA)
  endif()
  foreach(src ${FLEXC_GPU_TESTS})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    if(FLEXC_GPU_PORTABLE)
      target_link_libraries(${name} PRIVATE ${fx_gpu_link})
      target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
                                 ${CUDAToolkit_INCLUDE_DIRS})
      target_compile_definitions(${name} PRIVATE FLEXC_HAVE_CUDA)
    else()
      target_link_libraries(${name} PRIVATE flexc_internal CUDA::cudart_static)
    endif()
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                         ENVIRONMENT "FLEXC_SOURCE_DIR=${PROJECT_SOURCE_DIR};FLEXC_BUILD_DIR=${PROJECT_BINARY_DIR}")
  endforeach()
  # The command itself, linked the same way, for the training checks and benchmarks of
  # scripts/gpu-check.sh and gpu-bench.sh (packed as `flexc`; `flexc plot` is left out: cairo
  # does not travel).
  if(FLEXC_GPU_PORTABLE)
    find_library(fx_pcre2_a NAMES libpcre2-8.a REQUIRED)
    find_library(fx_utf8proc_a NAMES libutf8proc.a REQUIRED)
    add_executable(flexc_portable ${FLEXC_CLI_SOURCES})
    target_link_libraries(flexc_portable PRIVATE ${fx_gpu_link} ${fx_pcre2_a} ${fx_utf8proc_a})
    target_include_directories(flexc_portable PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
                               ${CUDAToolkit_INCLUDE_DIRS})
    target_compile_definitions(flexc_portable PRIVATE FLEXC_HAVE_CUDA)
    if(FLEXC_OPENMP)
      target_compile_options(flexc_portable PRIVATE ${OpenMP_C_FLAGS})
    endif()
  endif()
  # The timing program of scripts/gpu-bench.sh (not a test).
  add_executable(bench_cuda ${PROJECT_SOURCE_DIR}/bench/cuda_bench.c)
  if(FLEXC_GPU_PORTABLE)
    target_link_libraries(bench_cuda PRIVATE ${fx_gpu_link})
    target_include_directories(bench_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include ${CUDAToolkit_INCLUDE_DIRS})
  else()
    target_link_libraries(bench_cuda PRIVATE flexc_internal CUDA::cudart_static)
  endif()
endif()

# ---- the kernels on a CPU emulation ------------------------------------------------------
# The same GPU tests, built against src/cuda/emu.h: the kernels' code (index math, masks,
# split-KV, reductions, barriers and shuffles) runs on the CPU, in every build with a C++
# compiler, GPU or not (CTest label emu). Not under the sanitizers: the emulation switches
# stacks with swapcontext.
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER AND NOT FLEXC_SANITIZE AND NOT FLEXC_FUZZ)
  enable_language(CXX)
  # tests/cuda_emu/ holds one file per backend source (device.c, each .cu), each including it.
  file(GLOB FLEXC_EMU_UNITS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/cuda_emu/*.c
       ${PROJECT_SOURCE_DIR}/tests/cuda_emu/*.cpp)
  add_library(flexc_cuda_emu OBJECT ${FLEXC_EMU_UNITS} ${PROJECT_SOURCE_DIR}/src/cuda/emu.cpp)
  target_include_directories(flexc_cuda_emu PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(flexc_cuda_emu PRIVATE FX_CUDA_EMU FLEXC_HAVE_CUDA)
  set_target_properties(flexc_cuda_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
  target_compile_options(flexc_cuda_emu PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O2 -Wall -Wextra -Werror -Wno-unknown-pragmas>)
  file(GLOB FLEXC_EMU_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/test_cuda_gpu_*.c)
  foreach(src ${FLEXC_EMU_TESTS})
    get_filename_component(name ${src} NAME_WE)
    string(REPLACE "test_cuda_gpu_" "test_cuda_emu_" name ${name})
    add_executable(${name} ${src} $<TARGET_OBJECTS:flexc_cuda_emu>)
    target_compile_definitions(${name} PRIVATE FX_CUDA_EMU)
    target_link_libraries(${name} PRIVATE flexc_internal)
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS emu TIMEOUT ${FLEXC_TEST_TIMEOUT}
                         ENVIRONMENT "FLEXC_SOURCE_DIR=${PROJECT_SOURCE_DIR};FLEXC_BUILD_DIR=${PROJECT_BINARY_DIR}")
  endforeach()
endif()
