# Finds stagecraft's dependencies (Debian packages) and provides the imported targets the
# INTERFACE target links to. Used by the build tree and by the installed package config.
include(CMakeFindDependencyMacro)

# Inside find_package(stagecraft) a missing dependency makes stagecraft not found; in the
# build tree it is a hard error that names the package to install.
macro(_stagecraft_find name)
  if(CMAKE_FIND_PACKAGE_NAME)
    find_dependency(${name} ${ARGN})
  else()
    find_package(${name} ${ARGN})
    if(NOT ${name}_FOUND)
      message(FATAL_ERROR "stagecraft needs ${name}: run `bash cmake/install-deps.sh` (Debian packages)")
    endif()
  endif()
endmacro()

# Only what the headers include: xsimd (SIMD kernels; its config wants xtl), OpenMP, threads,
# zlib, nlohmann-json and OpenBLAS. xtensor is the benchmarks' own comparison, found there.
_stagecraft_find(xtl)
_stagecraft_find(xsimd)
_stagecraft_find(Threads)
_stagecraft_find(OpenMP COMPONENTS CXX)
_stagecraft_find(ZLIB)                  # data/idx.hpp reads gzip-compressed IDX files
_stagecraft_find(nlohmann_json 3.9)     # state/safetensors.hpp parses and writes JSON headers (3.9: ordered_json)

# OpenBLAS: Debian's config file sets variables only; wrap them in a target. Prefer the
# OpenMP build, which shares our OpenMP runtime instead of fighting it for the cores.
if(NOT TARGET stagecraft::openblas)
  find_path(STAGECRAFT_CBLAS_INCLUDE_DIR cblas.h
    PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
          /usr/include/openblas /usr/include
    NO_DEFAULT_PATH)
  if(NOT STAGECRAFT_CBLAS_INCLUDE_DIR)  # other layouts (Ubuntu 24.04's pthread build, other prefixes)
    find_path(STAGECRAFT_CBLAS_INCLUDE_DIR cblas.h
      PATH_SUFFIXES x86_64-linux-gnu/openblas-openmp x86_64-linux-gnu/openblas-pthread x86_64-linux-gnu
                    aarch64-linux-gnu/openblas-pthread openblas)
  endif()
  find_library(STAGECRAFT_OPENBLAS_LIBRARY NAMES openblas
    PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
    NO_DEFAULT_PATH)
  if(NOT STAGECRAFT_OPENBLAS_LIBRARY)
    find_library(STAGECRAFT_OPENBLAS_LIBRARY NAMES openblas)
  endif()
  if(NOT STAGECRAFT_CBLAS_INCLUDE_DIR OR NOT STAGECRAFT_OPENBLAS_LIBRARY)
    set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
    set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE
        "OpenBLAS not found: apt-get install libopenblas-openmp-dev (or run cmake/install-deps.sh)")
    if(NOT CMAKE_FIND_PACKAGE_NAME)
      message(FATAL_ERROR "OpenBLAS not found: apt-get install libopenblas-openmp-dev (or run cmake/install-deps.sh)")
    endif()
    return()
  endif()
  add_library(stagecraft::openblas INTERFACE IMPORTED)
  set_target_properties(stagecraft::openblas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${STAGECRAFT_CBLAS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${STAGECRAFT_OPENBLAS_LIBRARY}")
endif()
