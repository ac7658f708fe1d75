/* levers.h - every MINFER_* environment lever of the library, in one table.
 *
 * The runtime reads them (levers.c holds the library's only getenv calls)
 * and turns them into session settings, engine options and
 * mf_backend_options; the two process-wide ones the layers below need
 * before any model, MINFER_LOG and MINFER_POOL_SPIN_US, go to base's
 * setters in mf_levers_init. docs/ENV.md documents each row;
 * test_runtime_levers checks the two against each other and that no other
 * file of src/ reads the environment. Reading a name that is not in the
 * table is a programming error (MF_ASSERT). */
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

/* MINFER_LOG as a level (an unknown value: warn). */
mf_log_level mf_levers_log_level(void);

/* Hands base its process-wide levers, once: MINFER_LOG as the default log
 * level (mf_log_set_level still wins) and MINFER_POOL_SPIN_US. The public
 * API's entry points and the CLI's main call it; later calls do nothing. */
void mf_levers_init(void);

#endif
