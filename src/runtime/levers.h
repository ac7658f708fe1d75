/* levers.h - every MINFER_* environment lever of the library, in one table.
 *
 * The runtime reads them and turns them into session settings, engine
 * options and mf_backend_options. Three rows are read where they act, at
 * first use, because the layers below the runtime need them before or
 * without a model: MINFER_LOG (base.c), MINFER_POOL_SPIN_US (pool.c) and
 * MINFER_CPU_ISA (the CPU kernels' dispatch). docs/ENV.md documents
 * each row; test_runtime_levers checks the two against each other. Reading
 * a name that is not in the table is a programming error (MF_ASSERT). */
#ifndef MF_LEVERS_H
#define MF_LEVERS_H

#include <stdbool.h>

#include "backend/backend.h"

typedef enum mf_lever_type {
    MF_LEVER_FLAG,   /* set and not empty / 0 / false / off / no: on */
    MF_LEVER_INT,    /* an integer; anything else warns once and gives the default */
    MF_LEVER_STRING, /* empty: unset */
} mf_lever_type;

typedef struct mf_lever {
    const char *name;
    mf_lever_type type;
    const char *def;     /* the default as ENV.md states it ("" for none) */
    const char *meaning; /* one line */
} mf_lever;

int mf_lever_count(void);
const mf_lever *mf_lever_at(int i);
const mf_lever *mf_lever_find(const char *name);

/* The lever's value from the environment (its default when unset). */
bool mf_lever_flag(const char *name);
long mf_lever_int(const char *name);
const char *mf_lever_str(const char *name); /* NULL when unset and no default */

/* mf_backend_options from the levers (threads stay at their default). */
void mf_levers_backend_options(mf_backend_options *o);

#endif
