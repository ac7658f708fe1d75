# The drift check must fail on an altered copy of the stand-in header:
# three injected errors (a constant's value, an argument type, a selector),
# each named in the output. cmake -DDRIFT=<exe> -DAPI=<list> -DHEADER=<Metal.h>
# -DOUT=<copy> -P drift_injected.cmake
file(READ ${HEADER} _h)
function(_inject from to)
  string(FIND "${_h}" "${from}" _pos)
  if(_pos LESS 0)
    message(FATAL_ERROR "drift_injected: '${from}' is not in ${HEADER} (update the injected edits)")
  endif()
  string(REPLACE "${from}" "${to}" _new "${_h}")
  set(_h "${_new}" PARENT_SCOPE)
endfunction()
_inject("MTLResourceStorageModePrivate = 32" "MTLResourceStorageModePrivate = 33")
_inject("offset:(NSUInteger)offset atIndex:(NSUInteger)index" "offset:(NSUInteger)offset atIndex:(uint32_t)index")
_inject("- (void)commit" "- (void)commitNow")
file(WRITE ${OUT} "${_h}")
execute_process(COMMAND ${DRIFT} ${API} ${OUT} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
message("${_out}${_err}")
if(_rc EQUAL 0)
  message(FATAL_ERROR "drift_injected: the check passed a header with three injected errors")
endif()
foreach(_want "MTLResourceStorageModePrivate = 33, Apple 32"
              "setBuffer:offset:atIndex:: arguments (MTLBuffer* NSUInteger uint32_t)"
              "MTLCommandBuffer commitNow: not in Apple's API"
              ", 3 mismatches")
  string(FIND "${_out}" "${_want}" _pos)
  if(_pos LESS 0)
    message(FATAL_ERROR "drift_injected: expected '${_want}' in the output")
  endif()
endforeach()
