# Installation rules and the CMake package (flexparConfig.cmake).
include(GNUInstallDirs)
