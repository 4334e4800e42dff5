/* llm_norm.inc built three times: portable, AVX2+FMA and AVX-512 (x86-64; elsewhere all portable). */
#include "llm_norm.h"

#define add_row add_row_portable
#define scale_row scale_row_portable
#define NORM_PLAIN_ROW norm_plain_row_portable
#define NORM_SKIP_ROWS norm_skip_rows_portable
#define FUSED_SQ(h, acc) ((float)((double)(h) * (h) + (acc)))
#include "llm_norm.inc"
#undef add_row
#undef scale_row
#undef NORM_PLAIN_ROW
#undef NORM_SKIP_ROWS
#undef FUSED_SQ

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define add_row add_row_avx2
#define scale_row scale_row_avx2
#define NORM_PLAIN_ROW norm_plain_row_avx2
#define NORM_SKIP_ROWS norm_skip_rows_avx2
#define FUSED_SQ(h, acc) __builtin_fmaf((h), (h), (acc))
#include "llm_norm.inc"
#undef add_row
#undef scale_row
#undef NORM_PLAIN_ROW
#undef NORM_SKIP_ROWS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define add_row add_row_avx512
#define scale_row scale_row_avx512
#define NORM_PLAIN_ROW norm_plain_row_avx512
#define NORM_SKIP_ROWS norm_skip_rows_avx512
#include "llm_norm.inc"
#pragma GCC pop_options
#else
void norm_plain_row_avx2(const norm_job *j, long r) { norm_plain_row_portable(j, r); }
void norm_plain_row_avx512(const norm_job *j, long r) { norm_plain_row_portable(j, r); }
void norm_skip_rows_avx2(const norm_job *j, long r0, int nr) { norm_skip_rows_portable(j, r0, nr); }
void norm_skip_rows_avx512(const norm_job *j, long r0, int nr) { norm_skip_rows_portable(j, r0, nr); }
#endif
