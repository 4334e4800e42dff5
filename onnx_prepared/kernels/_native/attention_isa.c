/* attention.inc built three times: portable, AVX2+FMA and AVX-512 (x86-64; elsewhere all portable). */
#include "attention.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#define gqa_exp gqa_exp_portable
#define gqa_ld gqa_ld_portable
#define gqa_st gqa_st_portable
#define gqa_hsum_t gqa_hsum_t_portable
#define gqa_qk_block gqa_qk_block_portable
#define gqa_pv gqa_pv_portable
#define gqa_pv_all gqa_pv_all_portable
#define gqa_position gqa_position_portable
#define gqa_rotate gqa_rotate_portable
#define gqa_max gqa_max_portable
#define gqa_exp_sum gqa_exp_sum_portable
#define GQA_TASK gqa_task_portable
#define MADD(a, b, c) ((a) * (b) + (c))
#define VMADD(a, b, c) ((a) * (b) + (c))
#define GQA_VL 4
#define gv gv_portable
#include "attention.inc"
#undef gqa_exp
#undef gqa_ld
#undef gqa_st
#undef gqa_hsum_t
#undef gqa_qk_block
#undef gqa_pv
#undef gqa_pv_all
#undef gv
#undef GQA_VL
#undef VMADD
#undef gqa_position
#undef gqa_rotate
#undef gqa_max
#undef gqa_exp_sum
#undef GQA_TASK
#undef MADD

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define gqa_exp gqa_exp_avx2
#define gqa_ld gqa_ld_avx2
#define gqa_st gqa_st_avx2
#define gqa_hsum_t gqa_hsum_t_avx2
#define gqa_qk_block gqa_qk_block_avx2
#define gqa_pv gqa_pv_avx2
#define gqa_pv_all gqa_pv_all_avx2
#define gqa_position gqa_position_avx2
#define gqa_rotate gqa_rotate_avx2
#define gqa_max gqa_max_avx2
#define gqa_exp_sum gqa_exp_sum_avx2
#define GQA_TASK gqa_task_avx2
#define MADD(a, b, c) __builtin_fmaf((a), (b), (c))
#define VMADD(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define GQA_VL 8
#define gv gv_avx2
#include "attention.inc"
#undef gqa_exp
#undef gqa_ld
#undef gqa_st
#undef gqa_hsum_t
#undef gqa_qk_block
#undef gqa_pv
#undef gqa_pv_all
#undef gv
#undef GQA_VL
#undef VMADD
#undef gqa_position
#undef gqa_rotate
#undef gqa_max
#undef gqa_exp_sum
#undef GQA_TASK
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define gqa_exp gqa_exp_avx512
#define gqa_ld gqa_ld_avx512
#define gqa_st gqa_st_avx512
#define gqa_hsum_t gqa_hsum_t_avx512
#define gqa_qk_block gqa_qk_block_avx512
#define gqa_pv gqa_pv_avx512
#define gqa_pv_all gqa_pv_all_avx512
#define gqa_position gqa_position_avx512
#define gqa_rotate gqa_rotate_avx512
#define gqa_max gqa_max_avx512
#define gqa_exp_sum gqa_exp_sum_avx512
#define GQA_TASK gqa_task_avx512
#define VMADD(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define GQA_VL 16
#define gv gv_avx512
#include "attention.inc"
#pragma GCC pop_options
#else
void gqa_task_avx2(gqa_job *j, int t) { gqa_task_portable(j, t); }
void gqa_task_avx512(gqa_job *j, int t) { gqa_task_portable(j, t); }
#endif
