# Installation rules and the CMake package (flexparConfig.cmake), plus flexpar.pc for pkg-config.
#
# What lands under the prefix:
#   include/flexpar/**                      public headers, and the generated flexpar/version.hpp
#   lib/libflexpar.{a,so}                   the compiled parts (lib/)
#   lib/cmake/flexpar/flexparConfig.cmake   find_package(flexpar) — finds MPI (MPICH), Threads, UCX,
#   lib/cmake/flexpar/flexparTargets.cmake    CUDA as this build needed them; targets flexpar::flexpar
#                                             and, where built in, flexpar::ucx / ::cuda / ::nccl
#   lib/pkgconfig/flexpar.pc
#   share/flexpar/examples/                 the samples (samples/*.cpp, support/*.hpp) and a CMakeLists.txt
#                                             that builds them against this package (samples/installed/)
#
# As a subproject (add_subdirectory, FetchContent) nothing is installed unless FLEXPAR_INSTALL=ON.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

option(FLEXPAR_INSTALL "Generate flexpar's install rules" ${PROJECT_IS_TOP_LEVEL})
set(FLEXPAR_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/flexpar"
    CACHE STRING "Where flexparConfig.cmake is installed, relative to the prefix")

# ---- component targets -----------------------------------------------------------------------
# INTERFACE targets that carry the extra usage requirements of the headers that need a third-party
# library (flexpar/core/check_ucx.hpp, check_cuda.hpp); a consumer that includes them links the
# component. They exist only when the part is built in, so `find_package(flexpar COMPONENTS ucx)`
# fails for a build without UCX.
set(FLEXPAR_COMPONENTS "")
if(FLEXPAR_HAVE_UCX)
  add_library(flexpar_ucx INTERFACE)
  target_link_libraries(flexpar_ucx INTERFACE flexpar PkgConfig::UCX)
  list(APPEND FLEXPAR_COMPONENTS ucx)
endif()
if(FLEXPAR_HAVE_CUDA)
  # flexpar_cuda is a real library (lib/CMakeLists.txt): the GPU path.
  list(APPEND FLEXPAR_COMPONENTS cuda)
endif()
if(FLEXPAR_HAVE_NCCL)
  # The installed package looks for libnccl again on the consumer's machine (flexparConfig.cmake
  # defines flexpar::nccl_library); the build tree uses what flexpar_dependencies found.
  add_library(flexpar_nccl INTERFACE)
  target_include_directories(flexpar_nccl INTERFACE $<BUILD_INTERFACE:${NCCL_INCLUDE_DIR}>)
  target_link_libraries(flexpar_nccl INTERFACE flexpar_cuda
                        $<BUILD_INTERFACE:${NCCL_LIBRARY}> $<INSTALL_INTERFACE:flexpar::nccl_library>)
  list(APPEND FLEXPAR_COMPONENTS nccl)
endif()
foreach(component IN LISTS FLEXPAR_COMPONENTS)
  if(NOT TARGET flexpar::${component})
    add_library(flexpar::${component} ALIAS flexpar_${component})
  endif()
  set_target_properties(flexpar_${component} PROPERTIES EXPORT_NAME ${component})
endforeach()

if(NOT FLEXPAR_INSTALL)
  return()
endif()

# ---- headers and library ---------------------------------------------------------------------
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/flexpar"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        COMPONENT flexpar_development
        FILES_MATCHING PATTERN "*.hpp")
install(FILES "${PROJECT_BINARY_DIR}/include/flexpar/version.hpp"  # generated in lib/CMakeLists.txt
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/flexpar"
        COMPONENT flexpar_development)

set(flexpar_install_targets flexpar)
foreach(component IN LISTS FLEXPAR_COMPONENTS)
  list(APPEND flexpar_install_targets flexpar_${component})
endforeach()
install(TARGETS ${flexpar_install_targets}
        EXPORT flexparTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT flexpar_development
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT flexpar_runtime
                NAMELINK_COMPONENT flexpar_development
        RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT flexpar_runtime
        # lib/CMakeLists.txt's $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}> is evaluated before
        # GNUInstallDirs is included, so the installed include directory is set here.
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")

# ---- CMake package ---------------------------------------------------------------------------
install(EXPORT flexparTargets
        NAMESPACE flexpar::
        DESTINATION "${FLEXPAR_INSTALL_CMAKEDIR}"
        COMPONENT flexpar_development)

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/flexparConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/flexparConfig.cmake"
  INSTALL_DESTINATION "${FLEXPAR_INSTALL_CMAKEDIR}"
  NO_SET_AND_CHECK_MACRO)
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/flexparConfigVersion.cmake"
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/flexparConfig.cmake" "${PROJECT_BINARY_DIR}/flexparConfigVersion.cmake"
        DESTINATION "${FLEXPAR_INSTALL_CMAKEDIR}"
        COMPONENT flexpar_development)

# ---- pkg-config ------------------------------------------------------------------------------
# libflexpar is static by default, so what it links privately (OpenBLAS, zlib, UCX) is a public
# requirement for pkg-config users who do not pass --static.
set(FLEXPAR_PC_REQUIRES "mpich openblas zlib")
set(FLEXPAR_PC_LIBS_EXTRA "-pthread")
if(FLEXPAR_HAVE_UCX)
  string(APPEND FLEXPAR_PC_REQUIRES " ucx")
endif()
# Relocatable: the prefix is found from the .pc file's own place (pkg-config's ${pcfiledir}), so a
# `cmake --install build --prefix DIR` that differs from CMAKE_INSTALL_PREFIX still gives right paths.
file(RELATIVE_PATH FLEXPAR_PC_PREFIX_FROM_PCFILEDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" FLEXPAR_PC_PREFIX_FROM_PCFILEDIR "${FLEXPAR_PC_PREFIX_FROM_PCFILEDIR}")
foreach(dir INCLUDEDIR LIBDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(FLEXPAR_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(FLEXPAR_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
configure_file("${PROJECT_SOURCE_DIR}/cmake/flexpar.pc.in" "${PROJECT_BINARY_DIR}/flexpar.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/flexpar.pc"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
        COMPONENT flexpar_development)

# ---- examples --------------------------------------------------------------------------------
# Every sample, so that what README.md and doc/ show is in the package a reader has: the sources, the
# headers of samples/support they include, and the project that builds them with find_package(flexpar)
# (scripts/consumer-test builds from here each sample a page names).
file(GLOB flexpar_example_sources "${PROJECT_SOURCE_DIR}/samples/*.cpp")
file(GLOB flexpar_example_headers "${PROJECT_SOURCE_DIR}/samples/support/*.hpp")
install(FILES ${flexpar_example_sources} "${PROJECT_SOURCE_DIR}/samples/installed/CMakeLists.txt"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/flexpar/examples"
        COMPONENT flexpar_development)
install(FILES ${flexpar_example_headers}
        DESTINATION "${CMAKE_INSTALL_DATADIR}/flexpar/examples/support"
        COMPONENT flexpar_development)
