# STAGECRAFT_CUDA = AUTO | ON | OFF: the compiled CUDA kernels (kernels/*.cu) as the static library
# stagecraft::cuda, which stagecraft::stagecraft then links (STAGECRAFT_WITH_CUDA=1 in its users).
# AUTO builds them when a CUDA compiler is found and never fails the configure; OFF skips detection.
#
# STAGECRAFT_CUDA_EMULATOR=ON builds stagecraft::cuda from kernels/emulator/ instead: the same ABI
# run on the host (no CUDA toolkit or GPU needed), so the GPU paths and their tests run anywhere,
# slowly. For testing only: see kernels/emulator/emu.hpp.
option(STAGECRAFT_CUDA_EMULATOR "Build stagecraft::cuda as the host emulator of the kernels (tests only)" OFF)
include(CheckLanguage)
if(STAGECRAFT_CUDA_EMULATOR)
  file(GLOB _sc_emulator CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kernels/emulator/*.cpp)
  add_library(stagecraft_cuda STATIC ${_sc_emulator})
  add_library(stagecraft::cuda ALIAS stagecraft_cuda)
  set_target_properties(stagecraft_cuda PROPERTIES EXPORT_NAME cuda POSITION_INDEPENDENT_CODE ON)
  target_include_directories(stagecraft_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
  # Generated kernels are built at run time by this compiler against these headers.
  target_compile_definitions(stagecraft_cuda PRIVATE STAGECRAFT_EMU_CXX="${CMAKE_CXX_COMPILER}"
                             STAGECRAFT_EMU_INCLUDE="${CMAKE_CURRENT_SOURCE_DIR}/include")
  target_compile_features(stagecraft_cuda PRIVATE cxx_std_20)
  # Tests read the emulator's launch counts (emu::counts()): #include "emulator/emu.hpp".
  target_include_directories(stagecraft_cuda INTERFACE $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/kernels>)
  target_compile_definitions(stagecraft_cuda INTERFACE STAGECRAFT_CUDA_EMULATOR=1)
  find_package(Threads REQUIRED)
  target_link_libraries(stagecraft_cuda PUBLIC ${CMAKE_DL_LIBS} Threads::Threads PRIVATE stagecraft::openblas)
  set(STAGECRAFT_WITH_CUDA ON)
  set(STAGECRAFT_CUDA_IS_EMULATOR ON)
  message(STATUS "stagecraft: CUDA kernels EMULATED on the host (STAGECRAFT_CUDA_EMULATOR=ON; tests only)")
  return()
endif()
set(STAGECRAFT_CUDA_IS_EMULATOR OFF)
if(NOT STAGECRAFT_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "STAGECRAFT_CUDA must be AUTO, ON or OFF (got '${STAGECRAFT_CUDA}')")
endif()
set(STAGECRAFT_WITH_CUDA OFF)
if(NOT STAGECRAFT_CUDA STREQUAL "OFF")
  # nvcc compiles the kernels' host code with our C++ compiler, so both sides share one ABI.
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "Host compiler of nvcc")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(STAGECRAFT_WITH_CUDA ON)
  elseif(STAGECRAFT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STAGECRAFT_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(STAGECRAFT_WITH_CUDA)
  # H100/H200 unless the user picked architectures (set before enable_language, which would pick one).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "GPU architectures of the CUDA kernels")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  file(GLOB _sc_kernels CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kernels/*.cu)
  add_library(stagecraft_cuda STATIC ${_sc_kernels})
  add_library(stagecraft::cuda ALIAS stagecraft_cuda)
  set_target_properties(stagecraft_cuda PROPERTIES EXPORT_NAME cuda POSITION_INDEPENDENT_CODE ON
    CUDA_RUNTIME_LIBRARY None)
  # The kernels see only the dependency-free headers (rules, abi, philox): no Hana, no xtensor.
  target_include_directories(stagecraft_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
  # SC_HOST_DEVICE (detail/host_device.hpp) makes the rules callable from these kernels.
  target_compile_definitions(stagecraft_cuda PRIVATE STAGECRAFT_KERNELS=1)
  # C++20 by flag: CMake 3.25 knows no CUDA20 dialect for nvcc 13. std::array's constexpr members
  # are called from device code (the Philox rounds). --fmad=false: a product and a following sum
  # round apart, as on the CPU and in the NVRTC-generated fused kernels (kernels/rtc.cu), so eager
  # and traced GPU runs give the same bits.
  target_compile_options(stagecraft_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr --fmad=false>)
  target_link_libraries(stagecraft_cuda PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt CUDA::nvrtc ${CMAKE_DL_LIBS})
  # cuDNN (conv2d and its gradients, kernels/cudnn.cu) is optional and loaded at run time: only its
  # header is needed to build that path, and no user links it. Where the build finds the shared
  # library, its directory is where the kernels look when the loader's path has none.
  find_path(STAGECRAFT_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDNN_ROOT ENV CUDNN_PATH
    PATH_SUFFIXES include DOC "Directory of cudnn.h (optional: the cuDNN convolutions)")
  find_library(STAGECRAFT_CUDNN_LIBRARY NAMES cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ENV CUDNN_ROOT ENV CUDNN_PATH
    PATH_SUFFIXES lib lib64 DOC "libcudnn (optional: only its directory is recorded, the kernels load it at run time)")
  if(STAGECRAFT_CUDNN_INCLUDE_DIR)
    target_include_directories(stagecraft_cuda PRIVATE ${STAGECRAFT_CUDNN_INCLUDE_DIR})
    if(STAGECRAFT_CUDNN_LIBRARY)
      get_filename_component(_sc_cudnn_dir "${STAGECRAFT_CUDNN_LIBRARY}" DIRECTORY)
      set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/kernels/cudnn.cu APPEND PROPERTY
        COMPILE_DEFINITIONS "STAGECRAFT_CUDNN_DIR=\"${_sc_cudnn_dir}\"")
    endif()
    message(STATUS "stagecraft: cuDNN convolutions ON (cudnn.h in ${STAGECRAFT_CUDNN_INCLUDE_DIR}, loaded at run time)")
  else()
    message(STATUS "stagecraft: cuDNN convolutions OFF (no cudnn.h; set STAGECRAFT_CUDNN_INCLUDE_DIR): im2col + cuBLAS")
  endif()
  # kernels/rtc.cu compiles fused kernels at run time against the rules header: embed its text
  # (and the two standard headers NVRTC lacks), regenerated whenever one of them changes.
  set(_sc_rtc_dir ${CMAKE_CURRENT_BINARY_DIR}/stagecraft_rtc)
  set(_sc_rtc_inputs ${CMAKE_CURRENT_SOURCE_DIR}/include/stagecraft/ops/rules.hpp
    ${CMAKE_CURRENT_SOURCE_DIR}/include/stagecraft/ops/rules.inc
    ${CMAKE_CURRENT_SOURCE_DIR}/include/stagecraft/ops/rules_pow.inc
    ${CMAKE_CURRENT_SOURCE_DIR}/include/stagecraft/detail/host_device.hpp
    ${CMAKE_CURRENT_SOURCE_DIR}/kernels/rtc/cmath ${CMAKE_CURRENT_SOURCE_DIR}/kernels/rtc/type_traits)
  add_custom_command(OUTPUT ${_sc_rtc_dir}/rtc_headers.inc
    COMMAND ${CMAKE_COMMAND} -DROOT=${CMAKE_CURRENT_SOURCE_DIR} -DOUT=${_sc_rtc_dir}/rtc_headers.inc
            -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_rtc_headers.cmake
    DEPENDS ${_sc_rtc_inputs} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_rtc_headers.cmake
    COMMENT "Embedding the elementwise rules for NVRTC" VERBATIM)
  target_sources(stagecraft_cuda PRIVATE ${_sc_rtc_dir}/rtc_headers.inc)
  target_include_directories(stagecraft_cuda PRIVATE ${_sc_rtc_dir})
  message(STATUS "stagecraft: CUDA kernels ON (${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}; "
                 "-DSTAGECRAFT_CUDA=OFF builds without them)")
else()
  message(STATUS "stagecraft: CUDA kernels OFF (STAGECRAFT_CUDA=${STAGECRAFT_CUDA})")
endif()
