/* test_cudatune_parse.c - the CUDA tuning string and the kernel selectors
 * (src/backend/cuda/cuda_tune.c; pure C, so it runs without a GPU). */
#include "backend/cuda/cuda_tune.h"

#include "mf_test.h"

static mf_cuda_tune h200(void) {
    mf_cuda_tune t;
    mf_cuda_tune_defaults(&t, 90, 132, 48 << 10);
    return t;
}

MF_TEST(defaults_follow_the_device) {
    const mf_cuda_tune t = h200();
    CHECK_EQ_INT(t.sm_count, 132);
    CHECK_EQ_INT(t.mm_prefill, MF_CU_MM_MMA);
    CHECK_EQ_INT(t.attn_prefill, MF_CU_AP_MMA);
    CHECK_EQ_INT(t.attn_decode, MF_CU_AD_SHORT);
    CHECK_EQ_INT(t.pdl, 1);
    mf_cuda_tune v;
    mf_cuda_tune_defaults(&v, 75, 40, 48 << 10); /* Turing: no mma.sync tier, no PDL */
    CHECK_EQ_INT(v.sm_count, 40);
    CHECK_EQ_INT(v.mm_prefill, MF_CU_MM_WMMA);
    CHECK_EQ_INT(v.attn_prefill, MF_CU_AP_FLASH);
    CHECK_EQ_INT(v.pdl, 0);
}

MF_TEST(parse_names_and_numbers) {
    mf_cuda_tune t = h200();
    mf_error e = {{0}};
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "gemv=v3,attn_decode=split,pdl=0,v4=2,mma_min_nt=128,force=-2", &e), 0);
    CHECK_EQ_INT(t.gemv, MF_CU_GEMV_V3);
    CHECK_EQ_INT(t.attn_decode, MF_CU_AD_SPLIT);
    CHECK_EQ_INT(t.pdl, 0);
    CHECK_EQ_INT(t.v4, 2);
    CHECK_EQ_INT(t.mma_min_nt, 128);
    CHECK_EQ_INT(t.force, MF_CU_FORCE_GEMV_Q8);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "v4=auto,,gemv=auto,mma_chunk=1048576,attn_one_max=99", &e), 0);
    CHECK_EQ_INT(t.v4, -1);
    CHECK_EQ_INT(t.gemv, -1);
    CHECK_EQ_INT((long long)t.mma_chunk, 1048576);
    CHECK_EQ_INT(t.attn_one_max, 99);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, NULL, &e), 0);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "", &e), 0);
}

MF_TEST(bad_strings_change_nothing) {
    mf_cuda_tune t = h200();
    const mf_cuda_tune t0 = t;
    mf_error e = {{0}};
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "pdl=0,gemv=v9", &e), -1);
    CHECK_MSG(strstr(e.msg, "gemv=v9") && strstr(e.msg, "auto|v1|v3"), "%s", e.msg);
    CHECK(memcmp(&t, &t0, sizeof t) == 0); /* pdl=0 before the bad key did not stick */
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "nosuch=1", &e), -1);
    CHECK_MSG(strstr(e.msg, "unknown key 'nosuch'"), "%s", e.msg);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "pdl", &e), -1);
    CHECK_MSG(strstr(e.msg, "not key=value"), "%s", e.msg);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "pdl=2", &e), -1);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "mma_min_nt=8", &e), -1); /* the GEMV tier owns nt <= 8 */
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "v4=1x", &e), -1);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "v4=", &e), -1);
    CHECK(memcmp(&t, &t0, sizeof t) == 0);
}

MF_TEST(matmul_selector) {
    mf_cuda_tune t = h200();
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 1, true), MF_CU_MM_GEMV_Q8);
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 8, false), MF_CU_MM_GEMV_F32);
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 9, true), MF_CU_MM_WMMA);
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 63, true), MF_CU_MM_WMMA);
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 64, true), MF_CU_MM_MMA);
    mf_error e = {{0}};
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "gemv_q8=0,mm=simt", &e), 0);
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 1, true), MF_CU_MM_GEMV_F32);
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 512, true), MF_CU_MM_SIMT);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "force=mma", &e), 0);
    CHECK_EQ_INT(mf_cuda_sel_matmul(&t, 1, true), MF_CU_MM_MMA);
}

MF_TEST(decode_attention_selector) {
    mf_cuda_tune t = h200();
    CHECK_EQ_INT(mf_cuda_sel_attn_decode(&t, 100, true), MF_CU_AD_SHORT);
    CHECK_EQ_INT(mf_cuda_sel_attn_decode(&t, 100, false), MF_CU_AD_ONE);
    CHECK_EQ_INT(mf_cuda_sel_attn_decode(&t, 384, true), MF_CU_AD_SHORT);
    CHECK_EQ_INT(mf_cuda_sel_attn_decode(&t, 385, true), MF_CU_AD_SPLIT);
    mf_error e = {{0}};
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "attn_decode=one", &e), 0);
    CHECK_EQ_INT(mf_cuda_sel_attn_decode(&t, 100, true), MF_CU_AD_ONE);
    CHECK_EQ_INT(mf_cuda_tune_parse(&t, "attn_decode=block", &e), 0);
    CHECK_EQ_INT(mf_cuda_sel_attn_decode(&t, 100, true), MF_CU_AD_BLOCK);
}

MF_TEST(no_fusions_and_help) {
    mf_cuda_tune t = h200();
    mf_cuda_tune_no_fusions(&t);
    CHECK(!t.fuse_rope && !t.fuse_add && !t.fuse_norm && !t.norm_mm && !t.short_rope && !t.ffn_q8b);
    const char *h = mf_cuda_tune_help();
    CHECK(strstr(h, "gemv=auto|v1|v3") != NULL);
    CHECK(strstr(h, "attn_decode=block|split|one|short") != NULL);
}

MF_TEST_MAIN(MF_T(defaults_follow_the_device), MF_T(parse_names_and_numbers), MF_T(bad_strings_change_nothing),
             MF_T(matmul_selector), MF_T(decode_attention_selector), MF_T(no_fusions_and_help))
