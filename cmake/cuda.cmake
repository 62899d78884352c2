# STAGECRAFT_CUDA = AUTO | ON | OFF. The CUDA kernels arrive with the CUDA issue; today this
# only detects the toolkit and reports what a CUDA build would use.
# OFF skips detection entirely; AUTO never fails the configure.
include(CheckLanguage)
if(NOT STAGECRAFT_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "STAGECRAFT_CUDA must be AUTO, ON or OFF (got '${STAGECRAFT_CUDA}')")
endif()
set(STAGECRAFT_WITH_CUDA OFF)
if(NOT STAGECRAFT_CUDA STREQUAL "OFF")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(STAGECRAFT_WITH_CUDA ON)
  elseif(STAGECRAFT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STAGECRAFT_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()
message(STATUS "stagecraft: CUDA toolkit ${STAGECRAFT_WITH_CUDA} (STAGECRAFT_CUDA=${STAGECRAFT_CUDA}); no CUDA kernels yet")
