/* se_block.inc built three times: portable, AVX2 and AVX-512 (x86-64; elsewhere all portable). */
#include "se_block.h"

#define SE_ENTRY se_run_portable
#define se_mean se_mean_portable
#include "se_block.inc"
#undef SE_ENTRY
#undef se_mean

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define SE_ENTRY se_run_avx2
#define se_mean se_mean_avx2
#include "se_block.inc"
#undef SE_ENTRY
#undef se_mean
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define SE_ENTRY se_run_avx512
#define se_mean se_mean_avx512
#include "se_block.inc"
#pragma GCC pop_options
#else
void se_run_avx2(const se_job *j) { se_run_portable(j); }
void se_run_avx512(const se_job *j) { se_run_portable(j); }
#endif
