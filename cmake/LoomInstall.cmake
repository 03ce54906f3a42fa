# LoomInstall.cmake - what `cmake --install build [--prefix P]` (and
# `make install`) puts where, under GNUInstallDirs:
#   bin/loom, bin/loom-cuda (when built)
#   lib/libloom.so.0.1.0 (soname libloom.so.0), libloom.so, libloom.a
#   include/loom/*.h       the public headers (include/loom.h: all of them);
#                          headers under src/ are internal and stay behind
#   lib/pkgconfig/loom.pc  relocatable (${pcfiledir}); --static adds the
#                          dependencies of libloom.a
#   lib/cmake/loom/        loomConfig.cmake + loomConfigVersion.cmake:
#                          find_package(loom) gives loom::loom (the shared
#                          library) and loom::loom_static (the archive, with
#                          MPI, OpenBLAS, cJSON, libmicrohttpd, OpenMP as its
#                          interface)
#   share/loom/plan/       the cluster presets of `loom plan`
#   share/man/man1/        loom(1) and loom-<command>(1), made at build time
#                          from the text `--help` prints (cmake/LoomDocs.cmake)
#   share/bash-completion/completions/loom   from the same --help text
# and `cpack -G DEB` in the build directory makes loom_<version>_<arch>.deb of
# the same files under /usr (the end of this file).
include(CMakePackageConfigHelpers)

# ---- man pages and completion, generated from the built command ----------------
set(LOOM_COMMANDS train eval data generate serve export sim plan calibrate report)
set(LOOM_DOCS_DIR ${CMAKE_BINARY_DIR}/docs-gen)
set(LOOM_DOC_FILES ${LOOM_DOCS_DIR}/man1/loom.1 ${LOOM_DOCS_DIR}/completions/loom)
foreach(c ${LOOM_COMMANDS})
  list(APPEND LOOM_DOC_FILES ${LOOM_DOCS_DIR}/man1/loom-${c}.1)
endforeach()
add_custom_command(OUTPUT ${LOOM_DOC_FILES}
  COMMAND ${CMAKE_COMMAND} -DLOOM=$<TARGET_FILE:loom> -DOUT=${LOOM_DOCS_DIR} "-DCOMMANDS=${LOOM_COMMANDS}"
    -P ${PROJECT_SOURCE_DIR}/cmake/LoomDocs.cmake
  DEPENDS loom ${PROJECT_SOURCE_DIR}/cmake/LoomDocs.cmake
  COMMENT "man pages and bash completion from loom --help" VERBATIM)
add_custom_target(loom_docs ALL DEPENDS ${LOOM_DOC_FILES})

# ---- pkg-config ------------------------------------------------------------------
# Libs.private: what libloom.a needs besides the Requires.private packages
set(LOOM_PC_PRIVATE "")
foreach(l ${MPI_C_LIBRARIES})
  string(APPEND LOOM_PC_PRIVATE " ${l}")
endforeach()
if(LOOM_MVEC_LIB)
  string(APPEND LOOM_PC_PRIVATE " -lmvec")
endif()
if(LOOM_OPENMP AND OpenMP_C_FOUND)
  string(APPEND LOOM_PC_PRIVATE " ${OpenMP_C_FLAGS}")
endif()
string(APPEND LOOM_PC_PRIVATE " -lpthread -lm -ldl")
configure_file(${PROJECT_SOURCE_DIR}/cmake/loom.pc.in ${CMAKE_BINARY_DIR}/loom.pc @ONLY)

# ---- install rules -----------------------------------------------------------------
set(LOOM_INSTALL_COMMANDS loom)
if(LOOM_CUDA_ENABLED)
  list(APPEND LOOM_INSTALL_COMMANDS loom-cuda)
endif()
install(TARGETS ${LOOM_INSTALL_COMMANDS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS loomlib loom_shared EXPORT loomTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/loom DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/plan/ DESTINATION ${CMAKE_INSTALL_DATADIR}/loom/plan
  FILES_MATCHING PATTERN "*.json")
install(FILES ${CMAKE_BINARY_DIR}/loom.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
set(LOOM_MAN_PAGES ${LOOM_DOC_FILES}) # the pages of this build's commands (not stale ones in docs-gen)
list(FILTER LOOM_MAN_PAGES INCLUDE REGEX "\\.1$")
install(FILES ${LOOM_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${LOOM_DOCS_DIR}/completions/loom DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)

install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
set(LOOM_OPENMP_USED 0)
if(LOOM_OPENMP AND OpenMP_C_FOUND)
  set(LOOM_OPENMP_USED 1)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/loomConfig.cmake.in
  ${CMAKE_BINARY_DIR}/loomConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/loomConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/loomConfig.cmake ${CMAKE_BINARY_DIR}/loomConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)

# ---- a Debian package: `cpack -G DEB` in the build directory ------------------------
# The same files under /usr. Depends: what the command links (MPI, OpenBLAS,
# cJSON, libmicrohttpd) as the -dev packages, since the headers, loom.pc and
# loomConfig.cmake hand those on to programs built against loom; oneDNN and
# oneMKL are loaded at run time when present (Suggests).
set(CPACK_PACKAGE_NAME loom)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "loom developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "train and serve transformer language models with every parallelism axis in one device mesh")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "openmpi-bin, libopenmpi-dev, libopenblas-dev, libcjson-dev, libmicrohttpd-dev, libgomp1")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libdnnl-dev, fortunes-min, fortunes")
include(CPack)
