/* gguf.h - GGUF v2/v3 reader (mmap, zero-copy, every field validated) and a
 * streaming writer.
 *
 * Reader: mf_gguf_open maps the file read-only and parses it through a
 * bounds-checked cursor; tensor data are views into the mapping. A file named
 * like "model-00001-of-00003.gguf" opens all its parts as one model: metadata
 * from part 1, tensors from every part (split.* keys are checked). Any
 * malformed field fails the open with a message naming the field and value.
 * Tensor data must be laid out as llama.cpp requires: in table order, each
 * tensor at the previous one's end rounded up to the alignment (no overlap,
 * no gap), the first at offset 0, and nothing after the last but padding.
 *
 * Strings (keys, tensor names, string values) are exposed as mf_str: pointer
 * + length, NUL-terminated copies owned by the mf_gguf. */
#ifndef MF_GGUF_H
#define MF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define MF_GGUF_MAGIC 0x46554747u /* "GGUF" little endian */
#define MF_GGUF_DEFAULT_ALIGNMENT 32
#define MF_GGUF_MAX_ALIGNMENT (1u << 16)
#define MF_GGUF_MAX_DIMS 4
#define MF_GGUF_MAX_STRING (1ull << 20)      /* bytes in one string */
#define MF_GGUF_MAX_ARRAY (1ull << 27)       /* elements in one array */
#define MF_GGUF_MAX_KV 1000000ull
#define MF_GGUF_MAX_TENSORS 1000000ull
#define MF_GGUF_MAX_NAME 256                 /* bytes in a tensor name */
#define MF_GGUF_MAX_VOCAB 4000000ull         /* tokenizer.ggml.tokens entries */
#define MF_GGUF_MIN_ALIGNMENT 8              /* the widest scalar a block holds */
/* Parser memory (metadata nodes, string copies, tables) is charged against a
 * budget of MF_GGUF_MEM_PER_BYTE x the file size + MF_GGUF_MEM_BASE, never
 * more than MF_GGUF_MEM_CAP: real files need far less than one byte per file
 * byte, while a file of nested empty arrays needs ~9 bytes per byte. */
#define MF_GGUF_MEM_PER_BYTE 4ull
#define MF_GGUF_MEM_BASE (16ull << 20)
#define MF_GGUF_MEM_CAP (2ull << 30)

/* Exit status of a process whose mapped model file was truncated under it
 * (gguf_guard.c; MINFER_NO_MMAP=1 copies the file into memory instead). */
#define MF_GGUF_SIGBUS_EXIT 74

typedef enum mf_gguf_vtype {
    MF_GGUF_UINT8 = 0,
    MF_GGUF_INT8 = 1,
    MF_GGUF_UINT16 = 2,
    MF_GGUF_INT16 = 3,
    MF_GGUF_UINT32 = 4,
    MF_GGUF_INT32 = 5,
    MF_GGUF_FLOAT32 = 6,
    MF_GGUF_BOOL = 7,
    MF_GGUF_STRING = 8,
    MF_GGUF_ARRAY = 9,
    MF_GGUF_UINT64 = 10,
    MF_GGUF_INT64 = 11,
    MF_GGUF_FLOAT64 = 12,
    MF_GGUF_VTYPE_COUNT
} mf_gguf_vtype;

typedef struct mf_str {
    const char *ptr; /* NUL-terminated */
    uint64_t len;    /* bytes, excluding the terminator */
} mf_str;

typedef struct mf_gguf_tensor {
    mf_str name;
    uint32_t type;                  /* mf_type id, validated as known */
    uint32_t n_dims;                /* 1..4 */
    int64_t ne[MF_GGUF_MAX_DIMS];   /* ne[0] is the row length; unused dims are 1 */
    uint64_t offset;                /* from the start of its file's data section */
    uint64_t nbytes;
    const void *data;               /* view into the mapping */
    uint32_t part;                  /* split part index (0 for single files) */
} mf_gguf_tensor;

typedef struct mf_gguf mf_gguf;

/* How the reader holds a file's bytes. The runtime fills it from its levers
 * (MINFER_NO_MMAP, MINFER_MLOCK); the reader reads no environment. */
typedef struct mf_gguf_open_options {
    bool read; /* read into anonymous memory instead of mapping the file */
    bool lock; /* mlock the bytes; a failure (ulimit -l) is a warning */
} mf_gguf_open_options;

/* Opens and validates path (and its sibling parts for a split model),
 * mapped and not locked. */
int mf_gguf_open(const char *path, mf_gguf **out, mf_error *err);
/* The same with options (NULL: mf_gguf_open's). */
int mf_gguf_open_opts(const char *path, const mf_gguf_open_options *o, mf_gguf **out, mf_error *err);
/* Parses an in-memory file (not copied: buf must outlive the result). */
int mf_gguf_parse(const void *buf, size_t len, mf_gguf **out, mf_error *err);
void mf_gguf_close(mf_gguf *g);

uint32_t mf_gguf_version(const mf_gguf *g);
uint32_t mf_gguf_alignment(const mf_gguf *g);
uint64_t mf_gguf_data_offset(const mf_gguf *g); /* of part 0 */
uint32_t mf_gguf_n_parts(const mf_gguf *g);
uint64_t mf_gguf_file_size(const mf_gguf *g);   /* all parts together */
/* The page-aligned read-only mapping of a part (for zero-copy device buffers
 * that need page alignment). Returns -1 for a part index out of range or a
 * file parsed from memory with mf_gguf_parse. */
int mf_gguf_part_mapping(const mf_gguf *g, uint32_t part, const void **base, uint64_t *size);

/* ---- metadata ---------------------------------------------------------------- */

int64_t mf_gguf_n_kv(const mf_gguf *g);
int64_t mf_gguf_find_key(const mf_gguf *g, const char *key); /* index, or -1 */
mf_str mf_gguf_kv_key(const mf_gguf *g, int64_t i);
mf_gguf_vtype mf_gguf_kv_type(const mf_gguf *g, int64_t i);

/* Typed getters by key. Return 0 and set *out on success; 1 when the key is
 * absent (err untouched); -1 when it is present with another type or a value
 * that does not fit (err names key, declared type and value). Integer getters
 * accept any integer type whose value fits the target. */
int mf_gguf_get_u32(const mf_gguf *g, const char *key, uint32_t *out, mf_error *err);
int mf_gguf_get_i32(const mf_gguf *g, const char *key, int32_t *out, mf_error *err);
int mf_gguf_get_u64(const mf_gguf *g, const char *key, uint64_t *out, mf_error *err);
int mf_gguf_get_f32(const mf_gguf *g, const char *key, float *out, mf_error *err); /* f32 or f64 */
int mf_gguf_get_bool(const mf_gguf *g, const char *key, bool *out, mf_error *err);
int mf_gguf_get_str(const mf_gguf *g, const char *key, mf_str *out, mf_error *err);

/* Arrays. mf_gguf_get_arr finds an array and checks its element type (pass
 * MF_GGUF_VTYPE_COUNT to accept any); returns like the getters with *n the
 * element count and *kv the index for the element accessors below. */
int mf_gguf_get_arr(const mf_gguf *g, const char *key, mf_gguf_vtype want, int64_t *kv,
                    uint64_t *n, mf_error *err);
/* Like mf_gguf_get_arr for an array whose elements must be integers (any
 * integer type) / numbers (integers or floats): a string, bool or nested
 * array element type is an error naming the key and both types. */
int mf_gguf_get_arr_ints(const mf_gguf *g, const char *key, int64_t *kv, uint64_t *n,
                         mf_error *err);
int mf_gguf_get_arr_nums(const mf_gguf *g, const char *key, int64_t *kv, uint64_t *n,
                         mf_error *err);
mf_gguf_vtype mf_gguf_arr_type(const mf_gguf *g, int64_t kv);
uint64_t mf_gguf_arr_n(const mf_gguf *g, int64_t kv);
/* Element i of a string array. */
mf_str mf_gguf_arr_str(const mf_gguf *g, int64_t kv, uint64_t i);
/* Element i of a numeric or bool array, converted: bool as 0/1; floats to
 * int64 truncate and saturate (NaN gives 0); uint64 above INT64_MAX wraps
 * (cast back to uint64_t to read it). Index misuse is an MF_ASSERT. */
int64_t mf_gguf_arr_int(const mf_gguf *g, int64_t kv, uint64_t i);
double mf_gguf_arr_float(const mf_gguf *g, int64_t kv, uint64_t i);
/* Nested arrays: the sub-array at element i, as a kv-like handle usable with
 * the mf_gguf_arr_* accessors (handles are stable while g is open). */
int64_t mf_gguf_arr_sub(const mf_gguf *g, int64_t kv, uint64_t i);

/* Scalar value of kv i as text for display ("1.5", "true", "\"llama\"",
 * "[151936 strings]"); writes at most n bytes. */
void mf_gguf_kv_format(const mf_gguf *g, int64_t i, char *buf, size_t n);

/* ---- tensors -------------------------------------------------------------------- */

int64_t mf_gguf_n_tensors(const mf_gguf *g);
const mf_gguf_tensor *mf_gguf_tensor_at(const mf_gguf *g, int64_t i);
const mf_gguf_tensor *mf_gguf_find_tensor(const mf_gguf *g, const char *name); /* or NULL */

/* ---- writer ---------------------------------------------------------------------- */

/* Writes GGUF v3. Usage: set metadata and declare tensors, then
 * mf_gguf_writer_begin (writes header, metadata and tensor table to PATH.tmp),
 * then mf_gguf_writer_write for each tensor in declaration order (data may be
 * given in several calls per tensor, so a 7B model streams in bounded memory),
 * then mf_gguf_writer_finish (pads, fsyncs, renames PATH.tmp to PATH).
 * mf_gguf_writer_free on an unfinished writer removes the temp file. */
typedef struct mf_gguf_writer mf_gguf_writer;

mf_gguf_writer *mf_gguf_writer_new(void);
void mf_gguf_writer_free(mf_gguf_writer *w);
void mf_gguf_writer_set_alignment(mf_gguf_writer *w, uint32_t alignment);

/* Setting an existing key replaces its value (keys stay unique). */
void mf_gguf_writer_set_u8(mf_gguf_writer *w, const char *key, uint8_t v);
void mf_gguf_writer_set_i8(mf_gguf_writer *w, const char *key, int8_t v);
void mf_gguf_writer_set_u16(mf_gguf_writer *w, const char *key, uint16_t v);
void mf_gguf_writer_set_i16(mf_gguf_writer *w, const char *key, int16_t v);
void mf_gguf_writer_set_u32(mf_gguf_writer *w, const char *key, uint32_t v);
void mf_gguf_writer_set_i32(mf_gguf_writer *w, const char *key, int32_t v);
void mf_gguf_writer_set_u64(mf_gguf_writer *w, const char *key, uint64_t v);
void mf_gguf_writer_set_i64(mf_gguf_writer *w, const char *key, int64_t v);
void mf_gguf_writer_set_f32(mf_gguf_writer *w, const char *key, float v);
void mf_gguf_writer_set_f64(mf_gguf_writer *w, const char *key, double v);
void mf_gguf_writer_set_bool(mf_gguf_writer *w, const char *key, bool v);
void mf_gguf_writer_set_str(mf_gguf_writer *w, const char *key, const char *v);
/* Arrays: the data are copied. For strings, lens may be NULL (NUL-terminated). */
void mf_gguf_writer_set_arr(mf_gguf_writer *w, const char *key, mf_gguf_vtype type,
                            const void *data, uint64_t n);
void mf_gguf_writer_set_arr_str(mf_gguf_writer *w, const char *key, const char *const *strs,
                                const uint64_t *lens, uint64_t n);
/* Sets a value from its GGUF encoding (the bytes after the type tag), e.g. a
 * nested array: for ARRAY, u32 element type + u64 count + elements. The bytes
 * are validated with the reader's parser; a value it would reject makes
 * mf_gguf_writer_begin fail with the reason. */
void mf_gguf_writer_set_raw(mf_gguf_writer *w, const char *key, mf_gguf_vtype type,
                            const void *bytes, size_t nbytes);
/* Copies kv i of an open file (any type, arrays and nested arrays included). */
void mf_gguf_writer_copy_kv(mf_gguf_writer *w, const mf_gguf *g, int64_t i);

/* Declares a tensor; returns its index or -1 (bad shape/type/duplicate name). */
int64_t mf_gguf_writer_add_tensor(mf_gguf_writer *w, const char *name, uint32_t type,
                                  uint32_t n_dims, const int64_t *ne, mf_error *err);
int mf_gguf_writer_begin(mf_gguf_writer *w, const char *path, mf_error *err);
/* Appends bytes of the current tensor; moves to the next when it is complete.
 * Writing more bytes than the tensor holds is an error. */
int mf_gguf_writer_write(mf_gguf_writer *w, const void *data, size_t nbytes, mf_error *err);
int mf_gguf_writer_finish(mf_gguf_writer *w, mf_error *err);

#endif
