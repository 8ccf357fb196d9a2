# Cross-compile for aarch64 Linux (Jetson Orin, JetPack 6) with Debian's toolchain:
#   apt-get install g++-aarch64-linux-gnu qemu-user
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DKVDECK_PYTHON=OFF -DKVDECK_TESTS=ON
# `make cross-check` does this and runs the native tests under qemu-aarch64 (ctest uses
# CMAKE_CROSSCOMPILING_EMULATOR). On the Jetson itself build natively, without this file.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(KVDECK_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${KVDECK_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${KVDECK_CROSS_TRIPLE}-g++)

# Headers and libraries of the target only; programs (cmake, ninja) of the host.
set(CMAKE_FIND_ROOT_PATH /usr/${KVDECK_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Run target executables (ctest) under user-mode qemu with the target's sysroot, on an emulated
# Cortex-A76: ARMv8.2-A with the dot product, the feature set of the Orin's Cortex-A78AE that
# the neon kernels use (qemu 7.2 has no A78 model; `-cpu max` would also expose SVE and later).
find_program(KVDECK_QEMU_AARCH64 qemu-aarch64)
if(KVDECK_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KVDECK_QEMU_AARCH64} -L /usr/${KVDECK_CROSS_TRIPLE} -cpu cortex-a76)
endif()
