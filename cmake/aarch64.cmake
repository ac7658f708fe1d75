# aarch64.cmake - cross-compiles minfer for 64-bit ARM Linux with Debian's
# aarch64-linux-gnu gcc (packages gcc-aarch64-linux-gnu, libc6-dev-arm64-cross).
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake
# The binaries run on the build machine under qemu-user: CMake's cross-compiling
# emulator is set, so ctest launches every test through it
# (scripts/test-arm64.sh drives this). MINFER_AARCH64_PREFIX overrides the
# compiler prefix, MINFER_AARCH64_SYSROOT the target's library root.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT DEFINED MINFER_AARCH64_PREFIX)
  set(MINFER_AARCH64_PREFIX aarch64-linux-gnu-)
endif()
if(NOT DEFINED MINFER_AARCH64_SYSROOT)
  set(MINFER_AARCH64_SYSROOT /usr/aarch64-linux-gnu)
endif()
set(CMAKE_C_COMPILER ${MINFER_AARCH64_PREFIX}gcc)

# Libraries and headers come from the target tree only; programs (python for
# the test registration, the emulator) from the host.
set(CMAKE_FIND_ROOT_PATH ${MINFER_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

find_program(MINFER_QEMU_AARCH64 qemu-aarch64)
if(MINFER_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MINFER_QEMU_AARCH64};-L;${MINFER_AARCH64_SYSROOT})
endif()

# A cross build has no GPU backend to offer.
set(MINFER_CUDA OFF CACHE BOOL "" FORCE)
set(MINFER_METAL OFF CACHE BOOL "" FORCE)
