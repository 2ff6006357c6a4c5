# The API reference: `cmake --build BUILD --target flexpar_doc` runs Doxygen (doc/Doxyfile.in) over
# the public headers, with README.md as the main page and doc/*.md as pages, into BUILD/doc/html.
# Any Doxygen warning (an undocumented public entry point, a broken @param) fails the target.
# The target exists only when Doxygen is found (Debian: doxygen).
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "flexpar: Doxygen not found, no flexpar_doc target (apt-get install doxygen)")
  return()
endif()

set(FLEXPAR_DOC_OUTPUT_DIR "${PROJECT_BINARY_DIR}/doc")
configure_file("${PROJECT_SOURCE_DIR}/doc/Doxyfile.in" "${FLEXPAR_DOC_OUTPUT_DIR}/Doxyfile" @ONLY)
file(GLOB_RECURSE flexpar_doc_headers CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/include/flexpar/*.hpp"
     "${PROJECT_SOURCE_DIR}/doc/*.md")
add_custom_command(
  OUTPUT "${FLEXPAR_DOC_OUTPUT_DIR}/html/index.html"
  COMMAND "${CMAKE_COMMAND}" -E rm -rf "${FLEXPAR_DOC_OUTPUT_DIR}/html"
  COMMAND Doxygen::doxygen "${FLEXPAR_DOC_OUTPUT_DIR}/Doxyfile"
  DEPENDS "${FLEXPAR_DOC_OUTPUT_DIR}/Doxyfile" ${flexpar_doc_headers} "${PROJECT_SOURCE_DIR}/README.md"
          "${PROJECT_BINARY_DIR}/include/flexpar/version.hpp"
  WORKING_DIRECTORY "${FLEXPAR_DOC_OUTPUT_DIR}"
  COMMENT "Doxygen: flexpar API reference in ${FLEXPAR_DOC_OUTPUT_DIR}/html"
  VERBATIM)
add_custom_target(flexpar_doc DEPENDS "${FLEXPAR_DOC_OUTPUT_DIR}/html/index.html")
