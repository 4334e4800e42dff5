/* winpool.inc built three times: portable, AVX2 and AVX-512 (x86-64; elsewhere all portable). */
#include "winpool.h"

#define WP_ENTRY wp_planes_portable
#define plane plane_portable
#define reduce reduce_portable
#define horizontal horizontal_portable
#define is_2x2 is_2x2_portable
#define plane_2x2 plane_2x2_portable
#include "winpool.inc"
#undef WP_ENTRY
#undef plane
#undef reduce
#undef horizontal
#undef is_2x2
#undef plane_2x2

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define WP_ENTRY wp_planes_avx2
#define plane plane_avx2
#define reduce reduce_avx2
#define horizontal horizontal_avx2
#define is_2x2 is_2x2_avx2
#define plane_2x2 plane_2x2_avx2
#include "winpool.inc"
#undef WP_ENTRY
#undef plane
#undef reduce
#undef horizontal
#undef is_2x2
#undef plane_2x2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define WP_ENTRY wp_planes_avx512
#define plane plane_avx512
#define reduce reduce_avx512
#define horizontal horizontal_avx512
#define is_2x2 is_2x2_avx512
#define plane_2x2 plane_2x2_avx512
#include "winpool.inc"
#pragma GCC pop_options
#else
void wp_planes_avx2(const wp_job *j, int t) { wp_planes_portable(j, t); }
void wp_planes_avx512(const wp_job *j, int t) { wp_planes_portable(j, t); }
#endif
