/* depthwise.inc built three times: portable, AVX2+FMA and AVX-512 (x86-64; elsewhere all portable). */
#include "depthwise.h"

#define DW_ENTRY dw_planes_portable
#define DW_CL_ENTRY dw_cl_portable
#define DW_BLK_ENTRY dw_blk_portable
#define DW_VEC 4
#define plane plane_portable
#define dw_vec dw_vec_portable
#define dw_ivec dw_ivec_portable
#define dw_select dw_select_portable
#include "depthwise.inc"
#undef DW_ENTRY
#undef DW_CL_ENTRY
#undef DW_BLK_ENTRY
#undef DW_VEC
#undef plane
#undef dw_vec
#undef dw_ivec
#undef dw_select

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define DW_ENTRY dw_planes_avx2
#define DW_CL_ENTRY dw_cl_avx2
#define DW_BLK_ENTRY dw_blk_avx2
#define DW_VEC 8
#define plane plane_avx2
#define dw_vec dw_vec_avx2
#define dw_ivec dw_ivec_avx2
#define dw_select dw_select_avx2
#include "depthwise.inc"
#undef DW_ENTRY
#undef DW_CL_ENTRY
#undef DW_BLK_ENTRY
#undef DW_VEC
#undef plane
#undef dw_vec
#undef dw_ivec
#undef dw_select
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define DW_ENTRY dw_planes_avx512
#define DW_CL_ENTRY dw_cl_avx512
#define DW_BLK_ENTRY dw_blk_avx512
#define DW_VEC 16
#define plane plane_avx512
#define dw_vec dw_vec_avx512
#define dw_ivec dw_ivec_avx512
#define dw_select dw_select_avx512
#include "depthwise.inc"
#pragma GCC pop_options
#else
void dw_planes_avx2(const dw_job *j, int t) { dw_planes_portable(j, t); }
void dw_planes_avx512(const dw_job *j, int t) { dw_planes_portable(j, t); }
void dw_cl_avx2(const dw_job *j, int t) { dw_cl_portable(j, t); }
void dw_cl_avx512(const dw_job *j, int t) { dw_cl_portable(j, t); }
void dw_blk_avx2(const dw_job *j, int t) { dw_blk_portable(j, t); }
void dw_blk_avx512(const dw_job *j, int t) { dw_blk_portable(j, t); }
#endif
