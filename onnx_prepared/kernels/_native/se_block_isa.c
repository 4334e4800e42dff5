/* se_block.inc built three times: portable, AVX2 and AVX-512 (x86-64; elsewhere all portable). */
#include "se_block.h"

#define SE_VW 8
#define SE_OPS se_ops_portable
#define SE_FN(name) se_##name##_portable
#include "se_block.inc"
#undef SE_OPS
#undef SE_FN

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define SE_OPS se_ops_avx2
#define SE_FN(name) se_##name##_avx2
#include "se_block.inc"
#undef SE_OPS
#undef SE_FN
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#undef SE_VW
#define SE_VW 16
#define SE_OPS se_ops_avx512
#define SE_FN(name) se_##name##_avx512
#include "se_block.inc"
#pragma GCC pop_options
#else /* the wider levels are the portable code under their own names */
#define SE_OPS se_ops_avx2
#define SE_FN(name) se_##name##_avx2
#include "se_block.inc"
#undef SE_OPS
#undef SE_FN
#define SE_OPS se_ops_avx512
#define SE_FN(name) se_##name##_avx512
#include "se_block.inc"
#endif
