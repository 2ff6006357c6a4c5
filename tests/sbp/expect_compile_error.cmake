# cmake -DCXX=... -DFLAGS="a;b" -DSOURCE=... -DCASE=n [-DREGEX=...] -P expect_compile_error.cmake
# Compiles SOURCE with -DFLEXPAR_CASE=CASE (syntax only). Without REGEX it must compile; with REGEX it
# must fail and its diagnostics must match REGEX (so a program that fails for another reason fails the
# test too).
execute_process(COMMAND ${CXX} ${FLAGS} -fsyntax-only -DFLEXPAR_CASE=${CASE} ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}${err}")
if(NOT DEFINED REGEX OR REGEX STREQUAL "")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "case ${CASE} should compile but did not:\n${text}")
  endif()
  message(STATUS "case ${CASE} compiles, as it should")
  return()
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "case ${CASE} compiled but must not")
endif()
if(NOT text MATCHES "${REGEX}")
  message(FATAL_ERROR "case ${CASE} failed to compile, but its diagnostics do not match '${REGEX}':\n${text}")
endif()
message(STATUS "case ${CASE} is rejected with the expected diagnostic")
