# The Python package (python/, docs/python.md).
#
# Built by scikit-build-core (`pip install ./python`): only the shared library is built and it is
# installed into the package, as the `python` component, beside the Python glue that loads it.
# In the default build the pytest suite tests/python/ runs against this tree's libflexc.so and
# python/ (not an installed copy); it skips, with its reason, when torch or pytest is missing.
# Sanitizer and no-OpenMP builds do not run it: the interpreter is not instrumented, and
# PyTorch's OpenMP runtime is the point of several of its checks.
if(SKBUILD)
  # One file, libflexc.so: a wheel cannot hold the versioned names' symbolic links.
  set_property(TARGET flexc_shared PROPERTY VERSION)
  set_property(TARGET flexc_shared PROPERTY SOVERSION)
  install(TARGETS flexc_shared LIBRARY DESTINATION flexc COMPONENT python)
  return()
endif()

if(FLEXC_SANITIZE OR NOT FLEXC_OPENMP OR FLEXC_REFERENCE_KERNELS)
  return()
endif()
find_program(FLEXC_PYTHON3 python3)
if(FLEXC_PYTHON3)
  add_test(NAME python_torch COMMAND ${FLEXC_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/python/run.py)
else()
  add_test(NAME python_torch COMMAND sh -c "echo 'python3 not found: skipped'; exit 77")
endif()
# 77: python3, torch or pytest is missing (the reason is printed).
set_tests_properties(python_torch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1200
                     ENVIRONMENT "FLEXC_LIBRARY=$<TARGET_FILE:flexc_shared>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python")
