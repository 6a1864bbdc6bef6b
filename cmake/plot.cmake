# plot: `flexc plot` draws with cairo (SVG and PNG, and its text). Only the command links it,
# not the library; without cairo the command is built anyway and `flexc plot` says what to
# install, and tests/cli_plot.sh reports itself skipped (77).

pkg_check_modules(CAIRO IMPORTED_TARGET cairo)
if(CAIRO_FOUND)
  target_link_libraries(flexc PRIVATE PkgConfig::CAIRO)
  target_compile_definitions(flexc PRIVATE FLEXC_HAVE_CAIRO)
else()
  message(STATUS "cairo not found: flexc plot is built without drawing (Debian: libcairo2-dev)")
endif()
set_tests_properties(cli_plot PROPERTIES SKIP_RETURN_CODE 77)
