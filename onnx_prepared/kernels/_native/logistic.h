/* MLAS's logistic (onnxruntime's CPU Sigmoid) at each dispatch level, shared by act.c (Sigmoid) and
 * silu.c (the fused SiLU), so a fused and an unfused graph give the same bits. Every level computes
 * MLAS's FMA3 kernel, what onnxruntime runs on any x86-64 CPU with FMA (MLAS has no AVX-512 logistic):
 * 8 or 16 lanes at avx2 and above, one lane with fmaf at portable. (On a CPU without FMA onnxruntime
 * runs MLAS's SSE2 kernel, which rounds every product and sum on its own, so there the portable bits
 * differ from its bits by a few ulps; fmaf keeps portable bit-equal with onnxruntime on every CPU the
 * tests can force portable on, as GroupQueryAttention's portable copy does.) */
#ifndef ONNX_PREPARED_LOGISTIC_H
#define ONNX_PREPARED_LOGISTIC_H

#include <math.h>

#define LG_LO (-18.0f)
#define LG_HI 18.0f
#define LG_A9 4.37031012579801e-11f
#define LG_A7 1.15627324459942e-07f
#define LG_A5 6.08574864600143e-05f
#define LG_A3 8.51377133304701e-03f
#define LG_A1 2.48287947061529e-01f
#define LG_B10 6.10247389755681e-13f
#define LG_B8 5.76102136993427e-09f
#define LG_B6 6.29106785017040e-06f
#define LG_B4 1.70198817374094e-03f
#define LG_B2 1.16817656904453e-01f
#define LG_B0 9.93151921023180e-01f

/* FMA3 semantics, one lane: every multiply-add fused (fmaf), the result clamped below at 0 only */
static inline float logistic1(float v)
{
    v = v < LG_LO ? LG_LO : v;
    v = v > LG_HI ? LG_HI : v;
    const float v2 = v * v;
    float p = fmaf(v2, LG_A9, LG_A7);
    p = fmaf(v2, p, LG_A5);
    p = fmaf(v2, p, LG_A3);
    p = fmaf(v2, p, LG_A1);
    float q = fmaf(v2, LG_B10, LG_B8);
    q = fmaf(v2, q, LG_B6);
    q = fmaf(v2, q, LG_B4);
    q = fmaf(v2, q, LG_B2);
    q = fmaf(v2, q, LG_B0);
    p = v * p;
    const float r = p / q + 0.5f;
    return r < 0.0f ? 0.0f : r;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* FMA3 semantics: every multiply-add fused, the result clamped below at 0 only */
__attribute__((target("avx2,fma"))) static inline __m256 logistic8(__m256 v)
{
    v = _mm256_max_ps(_mm256_set1_ps(LG_LO), v);
    v = _mm256_min_ps(_mm256_set1_ps(LG_HI), v);
    const __m256 v2 = _mm256_mul_ps(v, v);
    __m256 p = _mm256_fmadd_ps(v2, _mm256_set1_ps(LG_A9), _mm256_set1_ps(LG_A7));
    p = _mm256_fmadd_ps(v2, p, _mm256_set1_ps(LG_A5));
    p = _mm256_fmadd_ps(v2, p, _mm256_set1_ps(LG_A3));
    p = _mm256_fmadd_ps(v2, p, _mm256_set1_ps(LG_A1));
    __m256 q = _mm256_fmadd_ps(v2, _mm256_set1_ps(LG_B10), _mm256_set1_ps(LG_B8));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B6));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B4));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B2));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B0));
    p = _mm256_mul_ps(v, p);
    const __m256 r = _mm256_add_ps(_mm256_div_ps(p, q), _mm256_set1_ps(0.5f));
    return _mm256_max_ps(_mm256_setzero_ps(), r);
}

/* the FMA3 kernel's operations on 16 lanes (MLAS has no AVX-512 logistic: the bits are the FMA3 ones) */
__attribute__((target("avx512f"))) static inline __m512 logistic16(__m512 v)
{
    v = _mm512_min_ps(_mm512_set1_ps(LG_HI), _mm512_max_ps(_mm512_set1_ps(LG_LO), v));
    const __m512 v2 = _mm512_mul_ps(v, v);
    __m512 p = _mm512_fmadd_ps(v2, _mm512_set1_ps(LG_A9), _mm512_set1_ps(LG_A7));
    p = _mm512_fmadd_ps(v2, p, _mm512_set1_ps(LG_A5));
    p = _mm512_fmadd_ps(v2, p, _mm512_set1_ps(LG_A3));
    p = _mm512_fmadd_ps(v2, p, _mm512_set1_ps(LG_A1));
    __m512 q = _mm512_fmadd_ps(v2, _mm512_set1_ps(LG_B10), _mm512_set1_ps(LG_B8));
    q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B6));
    q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B4));
    q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B2));
    q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B0));
    p = _mm512_mul_ps(v, p);
    const __m512 r = _mm512_add_ps(_mm512_div_ps(p, q), _mm512_set1_ps(0.5f));
    return _mm512_max_ps(_mm512_setzero_ps(), r);
}
#endif

#endif
