/* Between the emulator's execution (emu_rt.c) and its memory (emu_mem.c). */
#ifndef MF_EMU_INTERNAL_H
#define MF_EMU_INTERNAL_H
#include <stddef.h>

/* Called by the fault handler: names the fault and fails the running
 * dispatch (does not return); 0 when no dispatch runs on this thread. */
int mf_emu_fault(void *addr);
/* Names what a fault address hits: "4 bytes past the end of buffer 'x' (1024 bytes)". */
void mf_emu_mem_describe(const void *addr, char *out, size_t cap);
void mf_emu_mem_label_range(const void *p, size_t len, const char *label);
#endif
