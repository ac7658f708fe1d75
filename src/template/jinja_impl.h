/* jinja_impl.h - the template syntax tree shared by the parser
 * (jinja_parse.c) and the evaluator (jinja_eval.c). Private to src/template. */
#ifndef MF_JINJA_IMPL_H
#define MF_JINJA_IMPL_H

#include "template/jinja.h"

typedef enum jkind {
    /* statements */
    J_TEXT,     /* lit: the text */
    J_OUT,      /* a: expression */
    J_IF,       /* a: condition, body, els (an elif is a nested J_IF in els) */
    J_FOR,      /* targets in names, b: iterable, c: filter or NULL, body, els;
                   op = 1: recursive (loop(x) renders the body over x) */
    J_SET,      /* names (1+ targets) or a: J_ATTR target; b: value */
    J_SETBLOCK, /* names[0]; body rendered into the variable */
    J_MACRO,    /* name, params: names + defs (NULL = required), body */
    J_CALLBLOCK, /* a: the J_CALL; d: a J_MACRO "caller" (its params, body) */
    J_BREAK,
    J_CONTINUE,
    J_BLOCK,    /* a transparent block ({% generation %}) */
    /* expressions */
    J_LIT,      /* lit */
    J_NAME,     /* name */
    J_ATTR,     /* a.name */
    J_ITEM,     /* a[b] */
    J_SLICE,    /* a[b:c:d], missing parts NULL */
    J_CALL,     /* a(args, kw) */
    J_FILTER,   /* a | name(args, kw) */
    J_TEST,     /* a is [not] name(args); op = 1 for "is not" */
    J_NEG,      /* -a */
    J_NOT,      /* not a */
    J_BIN,      /* a op b */
    J_AND,
    J_OR,
    J_COND,     /* b if a else c */
    J_LISTLIT,  /* args */
    J_DICTLIT,  /* args: keys, kwv: values */
} jkind;

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT,
       OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode jnode;
struct jnode {
    jkind kind;
    int line, col;
    int op;
    mf_jv lit;
    const char *name;
    jnode *a, *b, *c, *d;
    jnode **args;
    int n_args;
    const char **kwn; /* keyword names (calls) / parameter names (macros) */
    jnode **kwv;
    int n_kw;
    const char **names; /* for / set targets */
    int n_names;
    jnode **body;
    int n_body;
    jnode **els;
    int n_els;
};

struct mf_jinja {
    mf_arena *arena;
    jnode **body;
    int n_body;
};

#endif
