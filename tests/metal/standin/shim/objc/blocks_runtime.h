/* GNUstep includes libobjc2's <objc/blocks_runtime.h>; with gcc's libobjc the
 * blocks runtime is libBlocksRuntime's <Block.h>. */
#include <Block.h>
