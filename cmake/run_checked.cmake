# cmake [-DMATCH=<regex>] [-DREJECT=<regex>] -P run_checked.cmake -- <command> [args...]
#
# Runs the command (its output echoed as it comes) and fails when its exit status is not 0, when
# MATCH is given and the output (stdout and stderr together) does not match it, or when REJECT is
# given and the output matches it. The tests of flexpar_add_checked_test (tests/CMakeLists.txt) run
# through this: ctest's PASS_REGULAR_EXPRESSION replaces the exit status, so an mpiexec run in which
# one rank printed the expected line and another exited 1 passed; here the exit status always decides.
# (Arguments are taken apart as a CMake list: none may contain a semicolon.)
set(command)
set(after_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 1 ${last})
  if(after_separator)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "run_checked.cmake: no command after --")
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output
                ECHO_OUTPUT_VARIABLE ECHO_ERROR_VARIABLE)
if(NOT status STREQUAL "0")
  message(FATAL_ERROR "run_checked: exit status ${status} (0 expected) of: ${command}")
endif()
if(DEFINED MATCH AND NOT MATCH STREQUAL "" AND NOT output MATCHES "${MATCH}")
  message(FATAL_ERROR "run_checked: the output does not match the expected regex: ${MATCH}")
endif()
if(DEFINED REJECT AND NOT REJECT STREQUAL "" AND output MATCHES "${REJECT}")
  message(FATAL_ERROR "run_checked: the output matches the rejected regex ${REJECT}: '${CMAKE_MATCH_0}'")
endif()
