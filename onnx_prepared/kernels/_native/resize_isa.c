/* resize.inc built three times: portable, AVX2 and AVX-512 (x86-64; elsewhere all portable). Implicit
 * contraction is off in this file: onnxruntime's bilinear sum has no fused multiply-adds, and the levels
 * must agree bit for bit. */
#pragma GCC optimize("fp-contract=off")
#include "resize.h"

#define RL_ENTRY rl_planes_portable
#define gather_row gather_row_portable
#define lerp_row lerp_row_portable
#define plane plane_portable
#include "resize.inc"
#undef RL_ENTRY
#undef gather_row
#undef lerp_row
#undef plane

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2")
#define RL_ENTRY rl_planes_avx2
#define gather_row gather_row_avx2
#define lerp_row lerp_row_avx2
#define plane plane_avx2
#include "resize.inc"
#undef RL_ENTRY
#undef gather_row
#undef lerp_row
#undef plane
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,prefer-vector-width=512")
#define RL_ENTRY rl_planes_avx512
#define gather_row gather_row_avx512
#define lerp_row lerp_row_avx512
#define plane plane_avx512
#include "resize.inc"
#pragma GCC pop_options
#else
void rl_planes_avx2(const rl_job *j, int t) { rl_planes_portable(j, t); }
void rl_planes_avx512(const rl_job *j, int t) { rl_planes_portable(j, t); }
#endif
