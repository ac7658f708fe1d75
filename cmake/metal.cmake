# metal.cmake - the Metal backend (src/backend/metal), included from the top
# level after the MINFER_METAL_EMU block.
#   macOS, MINFER_METAL=ON: against Apple's Metal + Foundation; kernels compiled
#     at start from the embedded MSL, or from a metallib built here with
#     Xcode's metal / metallib when those tools are found (MINFER_METALLIB_FILE
#     selects one at run time).
#   Linux, MINFER_METAL_EMU=ON: against EMU's stand-in framework
#     (mf_metal_standin) with the kernels compiled as C++ for the MSL emulator
#     (mf_msl_emu_library). Never in a shipped build.
set(MF_METAL_DIR ${CMAKE_SOURCE_DIR}/src/backend/metal)
file(GLOB MF_METAL_KERNELS CONFIGURE_DEPENDS ${MF_METAL_DIR}/kernels/*.metal)
set(MF_METAL_HEADERS ${MF_METAL_DIR}/metal_args.h ${MF_METAL_DIR}/kernels/dequant.h)

set(_mf_metal_build OFF)
if(MINFER_METAL AND APPLE)
  set(_mf_metal_build ON)
elseif(MINFER_METAL_EMU)
  if(TARGET mf_metal_standin AND COMMAND mf_msl_emu_library)
    set(_mf_metal_build ON)
  else()
    message(WARNING "MINFER_METAL_EMU: tests/metal provides no mf_metal_standin / mf_msl_emu_library; "
                    "the Metal backend is not built")
  endif()
elseif(MINFER_METAL)
  message(STATUS "MINFER_METAL needs macOS (or MINFER_METAL_EMU=ON on Linux); not built")
endif()

if(_mf_metal_build)
  if(NOT CMAKE_OBJC_COMPILER)
    find_program(_mf_clang clang REQUIRED)
    set(CMAKE_OBJC_COMPILER ${_mf_clang})
  endif()
  enable_language(OBJC)
  set(_embed ${CMAKE_BINARY_DIR}/mf_metal_source.c)
  # lists cross the command line joined by '|' (a ';' would split the command)
  string(REPLACE ";" "|" _hdrs "${MF_METAL_HEADERS}")
  string(REPLACE ";" "|" _srcs "${MF_METAL_KERNELS}")
  add_custom_command(OUTPUT ${_embed}
    COMMAND ${CMAKE_COMMAND} -DOUT=${_embed} -DHEADERS=${_hdrs} -DSOURCES=${_srcs}
            -P ${CMAKE_SOURCE_DIR}/cmake/metal_embed.cmake
    DEPENDS ${MF_METAL_KERNELS} ${MF_METAL_HEADERS} ${CMAKE_SOURCE_DIR}/cmake/metal_embed.cmake
    COMMENT "embedding the Metal kernels" VERBATIM)
  add_library(mf_metal STATIC ${MF_METAL_DIR}/metal_backend.c ${MF_METAL_DIR}/metal_device.m ${_embed})
  target_include_directories(mf_metal PUBLIC ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/include)
  target_link_libraries(mf_metal PUBLIC mf_backend mf_ir mf_quant mf_base)
  target_compile_definitions(mf_metal PUBLIC MINFER_HAVE_METAL=1)
  list(APPEND MF_GPU_LIBS mf_metal) # the registry and libminfer link it
  # manual retain/release; blocks for the completion handlers
  target_compile_options(mf_metal PRIVATE $<$<COMPILE_LANGUAGE:OBJC>:-fblocks -fno-objc-arc>)
  if(APPLE)
    target_link_libraries(mf_metal PUBLIC "-framework Metal" "-framework Foundation")
    find_program(MF_XCRUN xcrun)
    if(MF_XCRUN)
      execute_process(COMMAND ${MF_XCRUN} -sdk macosx -f metal OUTPUT_VARIABLE _mf_metal_tool
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _r1)
      execute_process(COMMAND ${MF_XCRUN} -sdk macosx -f metallib OUTPUT_VARIABLE _mf_metallib_tool
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _r2)
      if(_r1 EQUAL 0 AND _r2 EQUAL 0 AND _mf_metal_tool AND _mf_metallib_tool)
        set(_air ${CMAKE_BINARY_DIR}/minfer.air)
        add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/minfer.metallib
          COMMAND ${_mf_metal_tool} -c -x metal ${_embed}.msl -o ${_air}
          COMMAND ${_mf_metallib_tool} ${_air} -o ${CMAKE_BINARY_DIR}/minfer.metallib
          DEPENDS ${_embed} COMMENT "compiling the Metal kernels with Xcode's metal")
        add_custom_target(mf_metallib ALL DEPENDS ${CMAKE_BINARY_DIR}/minfer.metallib)
      endif()
    endif()
  else()
    target_compile_options(mf_metal PRIVATE $<$<COMPILE_LANGUAGE:OBJC>:-fobjc-runtime=gcc>)
    mf_msl_emu_library(mf_metal_kernels ${MF_METAL_KERNELS})
    target_include_directories(mf_metal_kernels_objs PRIVATE ${MF_METAL_DIR} ${MF_METAL_DIR}/kernels)
    target_link_libraries(mf_metal PUBLIC mf_metal_standin mf_metal_kernels)
  endif()
endif()
