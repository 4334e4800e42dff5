/* attention.inc built three times: portable, AVX2+FMA and AVX-512 (x86-64; elsewhere all portable).
 * Implicit contraction is off in this file: the only fused multiply-adds are MADD/VMADD, where
 * onnxruntime's kernels have them (attention.inc). */
#pragma GCC optimize("fp-contract=off")
#include "attention.h"

#include <math.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#define GQA_SFX _portable
#define GQA_TASK gqa_task_portable
/* Fused lane by lane (fmaf: one rounding; the FMA instruction where the CPU has it, libm's exact
 * software fma where it does not), so that this copy rounds as the FMA copies below and onnxruntime's
 * kernels do: an unfused a * b + c here moved one ulp in attention outputs, which deep layers of an
 * accuracy_level 4 model amplified to 1e-2 in the logits (tests/kernels/test_gqa_model_exact.py). */
#define LANES_FMA(a, b, c)                                                                             \
    ({                                                                                                 \
        __typeof__((a) + 0.0f) a_ = (a), b_ = (b), c_ = (c), r_;                                              \
        for (int i_ = 0; i_ < (int)(sizeof a_ / sizeof a_[0]); i_++) r_[i_] = fmaf(a_[i_], b_[i_], c_[i_]); \
        r_;                                                                                            \
    })
#define MADD(a, b, c) fmaf((a), (b), (c))
#define VMADD(a, b, c) LANES_FMA(a, b, c)
#define V8MADD(a, b, c) LANES_FMA(a, b, c)
#define GQA_VL 4
#include "attention.inc"
#undef GQA_SFX
#undef GQA_TASK
#undef MADD
#undef VMADD
#undef V8MADD
#undef LANES_FMA
#undef GQA_VL

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define GQA_SFX _avx2
#define GQA_TASK gqa_task_avx2
#define MADD(a, b, c) __builtin_fmaf((a), (b), (c))
#define VMADD(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V8MADD(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define GQA_VL 8
#include "attention.inc"
#undef GQA_SFX
#undef GQA_TASK
#undef VMADD
#undef V8MADD
#undef GQA_VL
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define GQA_SFX _avx512
#define GQA_TASK gqa_task_avx512
#define VMADD(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V8MADD(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define GQA_VL 16
#include "attention.inc"
#pragma GCC pop_options
#else
void gqa_task_avx2(gqa_job *j, int t) { gqa_task_portable(j, t); }
void gqa_task_avx512(gqa_job *j, int t) { gqa_task_portable(j, t); }
#endif
