# libFuzzer targets (FLEXC_FUZZ, clang only): what every target shares. The module files that
# follow (cmake/<module>.cmake, read in name order) declare theirs with flexc_add_fuzzer.

if(FLEXC_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FLEXC_FUZZ needs clang (CC=clang)")
  endif()
  set(FLEXC_FUZZ_SANITIZE -fsanitize=address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -g)
endif()

# flexc_add_fuzzer(<target> <source> <include regex> [<exclude regex>]): the fuzzer in <source>
# over the library sources whose paths match <include regex> (less those matching <exclude
# regex>), all instrumented for coverage, ASan and UBSan; the rest of the library is left out.
function(flexc_add_fuzzer target source include_regex)
  set(sources ${FLEXC_LIB_SOURCES})
  list(FILTER sources INCLUDE REGEX "${include_regex}")
  if(ARGC GREATER 3)
    list(FILTER sources EXCLUDE REGEX "${ARGV3}")
  endif()
  add_library(${target}_obj OBJECT ${sources})
  target_include_directories(${target}_obj PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${target}_obj PRIVATE -fsanitize=fuzzer-no-link ${FLEXC_FUZZ_SANITIZE})
  target_link_libraries(${target}_obj PUBLIC ${FLEXC_DEPS})
  add_executable(${target} ${source} $<TARGET_OBJECTS:${target}_obj>)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${target} PRIVATE -fsanitize=fuzzer ${FLEXC_FUZZ_SANITIZE})
  target_link_options(${target} PRIVATE -fsanitize=fuzzer ${FLEXC_FUZZ_SANITIZE})
  target_link_libraries(${target} PRIVATE ${FLEXC_DEPS})
endfunction()
