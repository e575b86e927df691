# install() rules and the package config, so that another CMake project can
#   find_package(gradzip REQUIRED)
#   target_link_libraries(app PRIVATE gradzip::gradzip)
# and include "compressors/codec.h" etc. (installed under include/gradzip/).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_gz_libs gz_common gz_kernels gz_compressors)
if(TARGET gz_comm)
  list(APPEND _gz_libs gz_comm)
endif()
foreach(t IN LISTS _gz_libs)
  string(REPLACE "gz_" "" _export_name ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${_export_name})
endforeach()

add_library(gz_all INTERFACE)
set_target_properties(gz_all PROPERTIES EXPORT_NAME gradzip)
target_link_libraries(gz_all INTERFACE ${_gz_libs})
add_library(gradzip::gradzip ALIAS gz_all)

install(TARGETS ${_gz_libs} gz_all EXPORT gradzipTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(dir common kernels compressors comm)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gradzip/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
install(EXPORT gradzipTargets NAMESPACE gradzip:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradzip)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gradzipConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gradzipConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradzip)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gradzipConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gradzipConfig.cmake ${PROJECT_BINARY_DIR}/gradzipConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradzip)

# The programs: gradzip-run (the launcher), gradzip-bench and gradzip-model, component
# "programs". Into bin/ of a CMake install; into the wheel's scripts folder
# when scikit-build-core builds the Python package (pyproject.toml installs
# this component), which pip puts on PATH next to python (venv/bin), so that
# gradzip-sweep and the user find the real executables there. The installed
# copies are run from anywhere: their RUNPATH keeps the directories of the
# libraries they link outside the system's (the CUDA runtime, NCCL, a UCX in
# /opt), as the build tree's copies have them.
if(DEFINED SKBUILD_SCRIPTS_DIR)
  set(_gz_programs_dir ${SKBUILD_SCRIPTS_DIR})
else()
  set(_gz_programs_dir ${CMAKE_INSTALL_BINDIR})
endif()
foreach(t gradzip-run gradzip-bench gradzip-model)
  if(TARGET ${t})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
    install(TARGETS ${t} RUNTIME DESTINATION ${_gz_programs_dir} COMPONENT programs)
  endif()
endforeach()
