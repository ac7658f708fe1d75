#!/usr/bin/env bash
# cmake --install into a scratch prefix puts the binary, libminfer (shared and
# static), minfer.h, minfer.pc and the CMake package in place; examples/simple.c
# then builds against the INSTALLED package, with pkg-config (shared and
# --static) and with find_package(minfer) (both targets), and every build runs
# and generates text.
set -u
. "$(dirname "$0")/lib.sh" --model
P=$TMP/prefix
if cmake --install "$BUILD" --prefix "$P" >"$TMP/install.log" 2>&1; then pass; else
    fail "cmake --install: $(tail -5 "$TMP/install.log")"; finish; fi
LIBDIR=$(dirname "$(find "$P" -name minfer.pc | head -1)")/..
for f in bin/minfer include/minfer.h share/doc/minfer/LICENSE; do
    [ -f "$P/$f" ] && pass || fail "not installed: $f"
done
for f in libminfer.a libminfer.so pkgconfig/minfer.pc cmake/minfer/minferConfig.cmake \
         cmake/minfer/minferConfigVersion.cmake; do
    [ -e "$LIBDIR/$f" ] && pass || fail "not installed: lib/$f"
done
# the shared library exports the public API and nothing internal
if nm -D --defined-only "$LIBDIR/libminfer.so" >"$TMP/syms" 2>/dev/null; then
    grep -q ' minfer_model_load$' "$TMP/syms" && pass || fail "libminfer.so lacks minfer_model_load"
    ! grep -q ' mf_' "$TMP/syms" && pass || fail "libminfer.so exports internal mf_ symbols"
fi
"$P/bin/minfer" --version | grep -qE '^minfer [0-9]+\.[0-9]+\.[0-9]+ \(commit [^)]+\)' && pass ||
    fail "installed minfer --version: $("$P/bin/minfer" --version)"

CC=${CC:-cc}
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
runs() { # NAME BINARY: the program generates text from the model
    local out
    out=$(env LD_LIBRARY_PATH="$LIBDIR" "$2" "$MODEL" "The capital of France is" 2>"$TMP/$1.err")
    [ $? -eq 0 ] && [ -n "$out" ] && pass || fail "$1: did not run: $(tail -3 "$TMP/$1.err")"
}
if $CC -o "$TMP/pc_shared" "$SRC/examples/simple.c" $(pkg-config --cflags --libs minfer) \
        2>"$TMP/cc.err"; then pass; runs pc_shared "$TMP/pc_shared"
    ldd "$TMP/pc_shared" | grep -q libminfer.so && pass || fail "pkg-config build is not shared"
else fail "pkg-config shared build: $(head -5 "$TMP/cc.err")"; fi
if $CC -o "$TMP/pc_static" "$SRC/examples/simple.c" -static-libgcc \
        $(pkg-config --cflags minfer) "$LIBDIR/libminfer.a" $(pkg-config --static --libs-only-l minfer | sed 's/-lminfer//') \
        2>"$TMP/cc.err"; then pass; runs pc_static "$TMP/pc_static"
    ! ldd "$TMP/pc_static" | grep -q libminfer.so && pass || fail "static build uses the .so"
else fail "pkg-config static build: $(head -5 "$TMP/cc.err")"; fi

# find_package(minfer) from a separate project, both targets
mkdir -p "$TMP/proj"
cp "$SRC/examples/simple.c" "$TMP/proj/"
cat >"$TMP/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(uses_minfer C)
find_package(minfer 0.1 REQUIRED)
add_executable(simple_shared simple.c)
target_link_libraries(simple_shared PRIVATE minfer::minfer)
add_executable(simple_static simple.c)
target_link_libraries(simple_static PRIVATE minfer::minfer_static)
CM
if cmake -S "$TMP/proj" -B "$TMP/proj/build" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release \
        >"$TMP/proj.log" 2>&1 && cmake --build "$TMP/proj/build" -j2 >>"$TMP/proj.log" 2>&1; then
    pass
    runs cm_shared "$TMP/proj/build/simple_shared"
    runs cm_static "$TMP/proj/build/simple_static"
else fail "find_package(minfer) project: $(tail -8 "$TMP/proj.log")"; fi
finish
