/* Test hooks of the stand-in Metal framework (C, callable from any test
 * that links mf_metal_standin). Each also has an environment variable so
 * scripted tests can use it without code. */
#ifndef MF_STANDIN_H
#define MF_STANDIN_H
#ifdef __cplusplus
extern "C" {
#endif

/* Commits never complete (status stays Committed, handlers never run):
 * the backend's bounded wait must time out. Env: MINFER_STANDIN_HANG=1. */
void mf_standin_set_hang(int on);

/* Takes a kernel name out of the registry newFunctionWithName: resolves
 * (hidden = 1) or puts it back (0); -1 if no such kernel.
 * Env: MINFER_STANDIN_HIDE_KERNEL=name[,name...] (read at MTLCreateSystemDefaultDevice). */
int mf_standin_hide_kernel(const char *name, int hidden);

/* newFunctionWithName:@"name" resolves to the kernel `impl` instead (a
 * deliberately faulty kernel from tests/metal/kernels_test); impl NULL
 * removes the substitution. Env: MINFER_STANDIN_SUBSTITUTE=name=impl. */
int mf_standin_substitute_kernel(const char *name, const char *impl);

/* Validation-layer and project-rule failures seen so far. Each is printed
 * as "metal stand-in: ..." on stderr and fails the command buffer it
 * belongs to (status Error); with MINFER_STANDIN_ABORT=1 it aborts instead. */
int mf_standin_violations(void);
const char *mf_standin_last_violation(void); /* "" when none */
void mf_standin_reset_violations(void);

/* maxTotalThreadsPerThreadgroup of pipelines created from now on
 * (default 1024). */
void mf_standin_set_pipeline_max_threads(unsigned n);

#ifdef __cplusplus
}
#endif
#endif
