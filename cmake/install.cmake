# install.cmake - `cmake --install`: the minfer binary, libminfer (one static
# archive and one shared library, each combining every internal module),
# minfer.h, minfer.pc and a CMake package (minferConfig.cmake + version).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The internal static libraries, in link order, that libminfer combines.
set(MF_ALL_LIBS libminfer mf_model mf_engine mf_registry mf_cpu mf_ref mf_backend mf_tokenizer
    mf_grammar mf_template mf_ir mf_gguf mf_quant mf_base
    ${MF_GPU_LIBS})
if(TARGET mf_cudatune)
  list(APPEND MF_ALL_LIBS mf_cudatune)
endif()

# Static: one archive made of the members of every module's archive.
set(_mf_combined ${CMAKE_BINARY_DIR}/lib-install/libminfer.a)
set(_mf_libs_files "")
foreach(l ${MF_ALL_LIBS})
  list(APPEND _mf_libs_files $<TARGET_FILE:${l}>)
endforeach()
if(APPLE)
  add_custom_command(OUTPUT ${_mf_combined}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/lib-install
    COMMAND libtool -static -o ${_mf_combined} ${_mf_libs_files}
    DEPENDS ${MF_ALL_LIBS} COMMENT "combining the static libraries into libminfer.a")
else()
  set(_mri "create ${_mf_combined}\n")
  foreach(l ${MF_ALL_LIBS})
    string(APPEND _mri "addlib $<TARGET_FILE:${l}>\n")
  endforeach()
  string(APPEND _mri "save\nend\n")
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/minfer_combine.mri CONTENT "${_mri}")
  add_custom_command(OUTPUT ${_mf_combined}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/lib-install
    COMMAND ${CMAKE_COMMAND} -E rm -f ${_mf_combined}
    COMMAND ${CMAKE_AR} -M < ${CMAKE_BINARY_DIR}/minfer_combine.mri
    DEPENDS ${MF_ALL_LIBS} ${CMAKE_BINARY_DIR}/minfer_combine.mri
    COMMENT "combining the static libraries into libminfer.a")
endif()
add_custom_target(minfer_static ALL DEPENDS ${_mf_combined})

# Shared: the combined archive linked whole into one .so that exports the
# public API only (minfer_*), so the internal mf_ names cannot clash with a
# program's.
file(WRITE ${CMAKE_BINARY_DIR}/mf_shared_stub.c "typedef int mf_shared_stub;\n")
add_library(minfer_shared SHARED ${CMAKE_BINARY_DIR}/mf_shared_stub.c)
set_target_properties(minfer_shared PROPERTIES OUTPUT_NAME minfer
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib-install)
add_dependencies(minfer_shared minfer_static)
set_property(TARGET minfer_shared APPEND PROPERTY LINK_DEPENDS ${_mf_combined})
if(APPLE)
  target_link_libraries(minfer_shared PRIVATE -Wl,-force_load,${_mf_combined})
else()
  file(WRITE ${CMAKE_BINARY_DIR}/minfer.map "{ global: minfer_*; local: *; };\n")
  target_link_libraries(minfer_shared PRIVATE -Wl,--whole-archive ${_mf_combined}
                        -Wl,--no-whole-archive)
  target_link_options(minfer_shared PRIVATE -Wl,--version-script=${CMAKE_BINARY_DIR}/minfer.map
                      -Wl,--no-undefined)
endif()
target_link_libraries(minfer_shared PRIVATE Threads::Threads m)
if(MINFER_CUDA)
  # the CUDA objects need the C++ runtime (static guards, operator new)
  target_link_libraries(minfer_shared PRIVATE CUDA::cudart stdc++)
endif()

# What a program links besides libminfer.
set(MF_PC_PRIVATE "-lpthread -lm")
set(MF_CMAKE_GPU_LINK "")
if(MINFER_CUDA)
  string(APPEND MF_PC_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -lstdc++")
  set(MF_CMAKE_GPU_LINK ";${CUDAToolkit_LIBRARY_DIR}/libcudart${CMAKE_SHARED_LIBRARY_SUFFIX};stdc++")
endif()
set(MF_LIBDIR_REL ${CMAKE_INSTALL_LIBDIR})
configure_file(${CMAKE_SOURCE_DIR}/cmake/minfer.pc.in ${CMAKE_BINARY_DIR}/minfer.pc @ONLY)
configure_file(${CMAKE_SOURCE_DIR}/cmake/minferConfig.cmake.in
               ${CMAKE_BINARY_DIR}/minferConfig.cmake @ONLY)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/minferConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)

install(TARGETS minfer RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS minfer_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${_mf_combined} DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/minfer.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_BINARY_DIR}/minfer.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(FILES ${CMAKE_BINARY_DIR}/minferConfig.cmake ${CMAKE_BINARY_DIR}/minferConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/minfer)
install(FILES ${CMAKE_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/minfer)
