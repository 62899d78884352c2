# Install rules and the package config, so find_package(stagecraft) works after cmake --install.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(DIRECTORY include/stagecraft DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS stagecraft stagecraft_precompiled EXPORT stagecraftTargets)
if(STAGECRAFT_WITH_CUDA)
  install(TARGETS stagecraft_cuda EXPORT stagecraftTargets)
endif()
install(EXPORT stagecraftTargets NAMESPACE stagecraft:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stagecraft)
configure_package_config_file(cmake/stagecraftConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/stagecraftConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stagecraft)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/stagecraftConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/stagecraftConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/stagecraftConfigVersion.cmake
              cmake/stagecraftDependencies.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stagecraft)
