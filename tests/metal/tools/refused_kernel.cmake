# A kernel the MSL emulator must refuse to compile, with a message naming why.
# cmake -DGEN=<mf_mslgen> -DCXX=<clang++> -DSRC=<bad.metal> -DOUT=<file.cpp>
#       -DINC=<emu dir> "-DFLAGS=<flags>" "-DEXPECT=<text>" -P refused_kernel.cmake
execute_process(COMMAND ${GEN} ${SRC} ${OUT} RESULT_VARIABLE _rc ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "mf_mslgen failed on ${SRC}: ${_err}")
endif()
separate_arguments(_flags UNIX_COMMAND "${FLAGS}")
execute_process(COMMAND ${CXX} ${_flags} -I${INC} -I${INC}/include -fsyntax-only ${OUT}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(_rc EQUAL 0)
  message(FATAL_ERROR "${SRC} compiled: the emulator accepted a kernel MSL refuses")
endif()
string(FIND "${_err}" "${EXPECT}" _pos)
if(_pos LESS 0)
  message(FATAL_ERROR "${SRC} failed, but without '${EXPECT}':\n${_err}")
endif()
message("${SRC}: refused as expected (${EXPECT})")
