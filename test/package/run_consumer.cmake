# CTest driver for the package tests (cmake -P): installs this build tree into a prefix, or
# configures, builds and runs the consumer project in a fresh directory.
#   -DSTEP=install    SOURCE_DIR BINARY_DIR PREFIX
#   -DSTEP=subdir     SOURCE_DIR WORK_DIR  (+ CXX LAUNCHER MAKE_PROGRAM)   consumer uses add_subdirectory
#   -DSTEP=installed  SOURCE_DIR WORK_DIR PREFIX (+ same)                  consumer uses find_package
cmake_minimum_required(VERSION 3.25)

function(run)
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT COMMAND_ERROR_IS_FATAL ANY)
endfunction()

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  run("${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${PREFIX}")
  foreach(f include/stagecraft/stagecraft.hpp lib/cmake/stagecraft/stagecraftConfig.cmake
            lib/cmake/stagecraft/stagecraftConfigVersion.cmake lib/cmake/stagecraft/stagecraftTargets.cmake
            lib/cmake/stagecraft/stagecraftDependencies.cmake)
    if(NOT EXISTS "${PREFIX}/${f}")
      message(FATAL_ERROR "install did not produce ${PREFIX}/${f}")
    endif()
  endforeach()
  if(EXISTS "${PREFIX}/bin")
    message(FATAL_ERROR "install put executables into ${PREFIX}/bin (tests or examples leaked)")
  endif()
  return()
endif()

if(NOT STEP MATCHES "^(subdir|installed)$")
  message(FATAL_ERROR "STEP must be install, subdir or installed (got '${STEP}')")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
if(STEP STREQUAL "subdir")
  # As a user without CUDA (README: "-DSTAGECRAFT_CUDA=OFF"): the CPU-only library, which also
  # keeps this test from building the CUDA kernels a second time (about 150 s of nvcc on 2 cores);
  # the installed package (STEP installed) is the one with the kernels.
  set(mode_args "-DSTAGECRAFT_SOURCE_DIR=${SOURCE_DIR}" -DSTAGECRAFT_CUDA=OFF)
else()
  set(mode_args "-DCMAKE_PREFIX_PATH=${PREFIX}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
endif()
set(generator -G Ninja)
if(MAKE_PROGRAM)
  list(APPEND generator "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
run("${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${WORK_DIR}" ${generator}
    "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}"
    "-DSTAGECRAFT_CONSUMER_MODE=${STEP}" ${mode_args})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}" -j2)
run("${WORK_DIR}/consumer")
if(STEP STREQUAL "installed")
  run("${WORK_DIR}/consumer_precompiled")
endif()
