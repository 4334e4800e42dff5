/* AVX-512 (F/BW/VL/DQ) + AVX512-VNNI MatMulNBits kernels: one zmm holds the 16 columns of a panel. */
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma"))), \
                             apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")
#endif
#include <immintrin.h>

#include "nbits_prep.h"

#define NB_INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
/* NOTE: block indices are ptrdiff_t, not int: the extension is built with Python's CFLAGS, which include
 * -fwrapv, and with a wrapping int index GCC 12 re-derives each address from the index in every iteration
 * (the int8 tile loop: 37 scalar instructions per block against 13; they take issue slots and ports from
 * the vector work). Except in i8_row32 (M = 1, bound by the weight stream): with a ptrdiff_t index there,
 * M=1 K=1024 N=32000 took 705 -> 723 us on one thread and 362 -> 378 on two (mins of 3 rounds, two builds
 * in alternating processes). */

NB_INLINE __m512 zp_vec(const nb_weights *w, int p, int b)
{
    if (w->zp_kind == NB_ZP_U4) {
        const __m128i x = _mm_loadl_epi64((const __m128i *)(w->zpn + ((size_t)p * w->kb + b) * 8));
        const __m128i m = _mm_set1_epi8(15);
        const __m128i lo = _mm_and_si128(x, m), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
        return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    }
    if (w->zp_kind == NB_ZP_F32) return _mm512_loadu_ps(w->zpf + ((size_t)p * w->kb + b) * 16);
    return _mm512_set1_ps(8.f);
}

NB_INLINE void store_row(const nb_call *c, int m, int p, __m512 v)
{
    const int n0 = 16 * p, ncols = c->w.N - n0 < 16 ? c->w.N - n0 : 16;
    const __mmask16 k = (__mmask16)((1u << ncols) - 1u);
    if (c->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, c->bias + n0));
    _mm512_mask_storeu_ps(c->y + (size_t)m * c->w.N + n0, k, v);
}

/* M = 1 streams the weights once from memory: software prefetch PF_BYTES ahead of the weight stream (and
 * PF_BLOCKS blocks ahead of the scales), since the hardware prefetchers stop at every 4 KiB page. A
 * prefetch past the end of the buffer is harmless (prefetches do not fault). Measured at M=1 with the
 * caches flushed before each call (int8, 2 threads, load 5-8, median GB/s of weights): 4 KiB ahead 33.6 /
 * 39.8 / 51.1 at N = 3072 / 5632 / 32000 (K = 1024), 8 KiB ahead 40.7 / 46.9 / 57.8, 12 and 16 KiB no
 * better than 8; into L2 (T1) instead of L1 no better. */
#ifndef PF_BYTES
#define PF_BYTES 8192
#endif
#ifndef PF_BLOCKS
#define PF_BLOCKS 8
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif

/* fp32: R rows x 16 columns; A independent accumulators per row hide the FMA latency at small R */
NB_INLINE void f32_tile(const nb_call *c, int p, int m, const int R, const int A)
{
    const nb_weights *w = &c->w;
    const int cpb = w->bs / 8;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * w->kb * 16;
    const __m512 lut = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f);
    const float *af[4], *as[4];
    __m512 yacc[4];
    UNROLL for (int r = 0; r < R; r++) {
        af[r] = c->af + (size_t)(m + r) * c->kpad;
        as[r] = c->asum + (size_t)(m + r) * w->kb;
        yacc[r] = _mm512_setzero_ps();
    }
    for (ptrdiff_t b = 0; b < w->kb; b++) {
        __m512 acc[4][8];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int a = 0; a < A; a++) acc[r][a] = _mm512_setzero_ps();
        if (R == 1) _mm_prefetch((const char *)(sp + (size_t)(b + PF_BLOCKS) * 16), _MM_HINT_T0);
        for (int ci = 0; ci < cpb; ci++, qp += 64) {
            if (R == 1) _mm_prefetch((const char *)qp + PF_BYTES, PF_HINT);
            const __m512i v = _mm512_loadu_si512((const void *)qp);
            const int k = b * w->bs + 8 * ci;
            /* nibble j -> float: vpermps looks up the low 4 bits of each lane in {0, 1, ..., 15} (one op
             * instead of and + cvt) */
            __m512 q[8];
            q[0] = _mm512_permutexvar_ps(v, lut);
            UNROLL for (int j = 1; j < 8; j++) q[j] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * NB_KPOS(j)), lut);
            UNROLL for (int j = 0; j < 8; j++) UNROLL for (int r = 0; r < R; r++)
                acc[r][j % A] = _mm512_fmadd_ps(q[j], _mm512_set1_ps(af[r][k + j]), acc[r][j % A]);
        }
        const __m512 s = _mm512_loadu_ps(sp + (size_t)b * 16), z = zp_vec(w, p, b);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 t = acc[r][0];
            UNROLL for (int a = 1; a < A; a++) t = _mm512_add_ps(t, acc[r][a]);
            t = _mm512_fnmadd_ps(z, _mm512_set1_ps(as[r][b]), t);
            yacc[r] = _mm512_fmadd_ps(s, t, yacc[r]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) store_row(c, m + r, p, yacc[r]);
}

/* int8 (accuracy_level 4): one row x one panel, vpdpbusd of the weight nibbles (u8) with the quantized A
 * (s8); each low- or high-nibble vector of a chunk against 4 consecutive A values is one quad of k values
 * (layout v2). Block 32 keeps onnxruntime's 16 float chains per output in registers (F, nbits.h); the
 * zero-point term, bias and the final adds are in i8_store. */
NB_INLINE int32_t a32(const int8_t *a)
{
    int32_t v;
    memcpy(&v, a, 4);
    return v;
}

NB_INLINE __m512i dp(__m512i acc, __m512i u, const int8_t *a)
{
    return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(a32(a)));
}

/* dp with A's 4 bytes as an embedded broadcast memory operand ({1to16}): the compiler emits a separate
 * vpbroadcastd for _mm512_set1_epi32 */
NB_INLINE __m512i dpm(__m512i acc, __m512i u, const int8_t *a)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)(const void *)a));
    return acc;
}

/* the zero-point term's factor of block b for panel p: sb (symmetric: asum holds 8 * ablk) or sb * zp, so
 * that z = fnmadd(asum, zs, z) over the blocks in order is onnxruntime's fma chain of ablk * -(sb * zp) */
NB_INLINE __m512 zs_vec(const nb_weights *w, int p, int b)
{
    const __m512 sb = _mm512_loadu_ps(w->sc + ((size_t)p * w->kb + b) * 16);
    return w->zp_kind == NB_ZP_NONE ? sb : _mm512_mul_ps(sb, zp_vec(w, p, b));
}

/* the zero-point terms of rows m..m+nr-1 (nr <= 8) for panel p into zb[row][16]: the rows' chains side by
 * side (one chain alone is bound by the fma latency, 4 cycles per block) */
#define ZROWS 32
NB_INLINE void zterms_n(const nb_call *c, int m, const int nr, int p, float *zb)
{
    const int kb = c->w.kb;
    __m512 z[8];
    UNROLL for (int i = 0; i < 8; i++) z[i] = _mm512_setzero_ps();
    for (ptrdiff_t b = 0; b < kb; b++) {
        const __m512 zs = zs_vec(&c->w, p, b);
        UNROLL for (int i = 0; i < 8; i++)
            if (i < nr) z[i] = _mm512_fnmadd_ps(_mm512_set1_ps(c->asum[(size_t)(m + i) * kb + b]), zs, z[i]);
    }
    UNROLL for (int i = 0; i < 8; i++)
        if (i < nr) _mm512_store_ps(zb + 16 * i, z[i]);
}

/* zterms_n with the row count a constant when it is 8 (no per-row test inside the block loop) */
NB_INLINE void zterms(const nb_call *c, int m, int nr, int p, float *zb)
{
    if (nr == 8)
        zterms_n(c, m, 8, p, zb);
    else
        zterms_n(c, m, nr, p, zb);
}

/* y (the dot part of 16 columns) + bias, + the zero-point term z, stored */
NB_INLINE void i8_store(const nb_call *c, int m, int p, __m512 y, __m512 z)
{
    const int n0 = 16 * p, ncols = c->w.N - n0 < 16 ? c->w.N - n0 : 16;
    const __mmask16 k = (__mmask16)((1u << ncols) - 1u);
    if (c->bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(k, c->bias + n0));
    _mm512_mask_storeu_ps(c->y + (size_t)m * c->w.N + n0, k, _mm512_add_ps(y, z));
}

/* the low- and high-nibble vectors of chunk ci of the block at q */
NB_INLINE void ld_chunk(const uint8_t *q, int ci, __m512i *lo, __m512i *hi)
{
    const __m512i mask = _mm512_set1_epi8(15), v = _mm512_loadu_si512((const void *)(q + 64 * ci));
    *lo = _mm512_and_si512(v, mask);
    *hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), mask);
}

NB_INLINE void i8_row32(const nb_call *c, int m, int p, const int PF)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, kb4 = kb & ~3;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const int8_t *a = c->aq + (size_t)m * c->kpad;
    const float *asc = c->ascale + (size_t)m * kb;
    const float *abk = c->asum + (size_t)m * kb;
    __m512 F[16], z = _mm512_setzero_ps();
    UNROLL for (int j = 0; j < 16; j++) F[j] = _mm512_setzero_ps();
    int b = 0; /* int, not ptrdiff_t: the NOTE at the top */
    for (; b < kb4; b += 4) {
        UNROLL for (int beta = 0; beta < 4; beta++) {
            const uint8_t *q = qp + (size_t)(b + beta) * 256;
            const int8_t *ab = a + (size_t)(b + beta) * 32;
            if (PF) {
                _mm_prefetch((const char *)(sp + (size_t)(b + beta + PF_BLOCKS) * 16), _MM_HINT_T0);
                UNROLL for (int ci = 0; ci < 4; ci++) _mm_prefetch((const char *)q + 64 * ci + PF_BYTES, PF_HINT);
            }
            const __m512i z0 = _mm512_setzero_si512();
            __m512i lo0, hi0, lo1, hi1;
            ld_chunk(q, 0, &lo0, &hi0);
            ld_chunk(q, 1, &lo1, &hi1);
            const __m512i x0 = dp(dp(z0, lo0, ab), lo1, ab + 8);      /* quads 0 + 2 */
            const __m512i x1 = dp(dp(z0, hi0, ab + 4), hi1, ab + 12); /* quads 1 + 3 */
            ld_chunk(q, 2, &lo0, &hi0);
            ld_chunk(q, 3, &lo1, &hi1);
            const __m512i x2 = dp(dp(z0, lo0, ab + 16), lo1, ab + 24); /* quads 4 + 6 */
            const __m512i x3 = dp(dp(z0, hi0, ab + 20), hi1, ab + 28); /* quads 5 + 7 */
            const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(sp + (size_t)(b + beta) * 16), _mm512_set1_ps(asc[b + beta]));
            z = _mm512_fnmadd_ps(_mm512_set1_ps(abk[b + beta]), zs_vec(w, p, b + beta), z);
            const int base = (beta & 1) * 8 + (beta >> 1) * 2;
            F[base] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x0), s, F[base]);
            F[base + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x1), s, F[base + 1]);
            F[base + 4] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x2), s, F[base + 4]);
            F[base + 5] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x3), s, F[base + 5]);
        }
    }
    __m512 G[8];
    UNROLL for (int j = 0; j < 8; j++) G[j] = _mm512_add_ps(F[j], F[j + 8]);
    for (; b < kb; b++) {
        const uint8_t *q = qp + (size_t)b * 256;
        const int8_t *ab = a + (size_t)b * 32;
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(asc[b]), _mm512_loadu_ps(sp + (size_t)b * 16));
        z = _mm512_fnmadd_ps(_mm512_set1_ps(abk[b]), zs_vec(w, p, b), z);
        UNROLL for (int ci = 0; ci < 4; ci++) {
            __m512i lo, hi;
            ld_chunk(q, ci, &lo, &hi);
            const __m512i z0 = _mm512_setzero_si512();
            G[2 * ci] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp(z0, lo, ab + 8 * ci)), s, G[2 * ci]);
            G[2 * ci + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp(z0, hi, ab + 8 * ci + 4)), s, G[2 * ci + 1]);
        }
    }
    const __m512 lo = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(G[0], G[1]), G[2]), G[3]);
    const __m512 hi = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(G[4], G[5]), G[6]), G[7]);
    __m512 y = _mm512_add_ps(lo, hi);
    const int n0 = 16 * p, n4 = w->N & ~3;
    if (n0 + 16 > n4) { /* onnxruntime sums the last N % 4 columns in another order */
        const __m512 e = _mm512_add_ps(_mm512_add_ps(G[4], G[0]), _mm512_add_ps(G[6], G[2]));
        const __m512 o = _mm512_add_ps(_mm512_add_ps(G[5], G[1]), _mm512_add_ps(G[7], G[3]));
        const int keep = n4 - n0 > 0 ? n4 - n0 : 0;
        y = _mm512_mask_blend_ps((__mmask16)(0xFFFFu << keep), y, _mm512_add_ps(e, o));
    }
    i8_store(c, m, p, y, z);
}

/* quad qd (k 4qd..4qd+3) of the block at q: the low or high nibbles of chunk qd / 2 */
NB_INLINE __m512i quad_w(const uint8_t *q, int qd)
{
    const __m512i mask = _mm512_set1_epi8(15), v = _mm512_loadu_si512((const void *)(q + 64 * (qd >> 1)));
    return (qd & 1) ? _mm512_and_si512(_mm512_srli_epi32(v, 4), mask) : _mm512_and_si512(v, mask);
}

/* f + (quad qa + quad qb of the block at q, a) * s, one rounding */
NB_INLINE __m512 ch2(__m512 f, const uint8_t *q, const int8_t *a, int qa, int qb, __m512 s)
{
    const __m512i x = dp(dp(_mm512_setzero_si512(), quad_w(q, qa), a + 4 * qa), quad_w(q, qb), a + 4 * qb);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), s, f);
}

/* block sizes 16, 64, 128, 256: onnxruntime's order for each (nbits.h), one row x one panel, its 16
 * chains in registers */
NB_INLINE void i8_row_any(const nb_call *c, int m, int p, const int PF)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, bs = w->bs, n0 = 16 * p, n4 = w->N & ~3;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const int8_t *a = c->aq + (size_t)m * c->kpad;
    const float *asc = c->ascale + (size_t)m * kb, *abk = c->asum + (size_t)m * kb;
    __m512 F[16], z = _mm512_setzero_ps(), y;
    UNROLL for (int j = 0; j < 16; j++) F[j] = _mm512_setzero_ps();
#define BLOCK_HEAD(b)                                                                                      \
    const uint8_t *q = qp + (size_t)(b) * bs * 8;                                                          \
    const int8_t *ab = a + (size_t)(b) * bs;                                                               \
    if (PF) {                                                                                              \
        _mm_prefetch((const char *)(sp + (size_t)((b) + PF_BLOCKS) * 16), _MM_HINT_T0);                   \
        for (int ci = 0; ci < bs / 8; ci++) _mm_prefetch((const char *)q + 64 * ci + PF_BYTES, PF_HINT);   \
    }                                                                                                      \
    z = _mm512_fnmadd_ps(_mm512_set1_ps(abk[b]), zs_vec(w, p, (b)), z);
    if (bs == 16) {
        const int kb8 = kb & ~7;
        ptrdiff_t b = 0;
        for (; b < kb8; b++) {
            BLOCK_HEAD(b)
            const int beta = b & 7, base = 4 * (beta & 3) + (beta < 4 ? 0 : 2);
            const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(sp + (size_t)b * 16), _mm512_set1_ps(asc[b]));
            F[base] = ch2(F[base], q, ab, 0, 2, s);
            F[base + 1] = ch2(F[base + 1], q, ab, 1, 3, s);
        }
        __m512 G[8];
        UNROLL for (int j = 0; j < 8; j++) G[j] = _mm512_add_ps(F[j], F[j + 8]);
        for (; b < kb; b++) { /* trailing blocks: k pairs (A masked to two bytes of a quad) */
            BLOCK_HEAD(b)
            const __m512 s = _mm512_mul_ps(_mm512_set1_ps(asc[b]), _mm512_loadu_ps(sp + (size_t)b * 16));
            UNROLL for (int j = 0; j < 8; j++) {
                const int qd = 2 * (j >> 2) + ((j & 3) >> 1);
                const int32_t av = a32(ab + 4 * qd) & (int32_t)((j & 1) ? 0xFFFF0000u : 0x0000FFFFu);
                const __m512i x = _mm512_dpbusd_epi32(_mm512_setzero_si512(), quad_w(q, qd), _mm512_set1_epi32(av));
                G[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), s, G[j]);
            }
        }
        const __m512 lo = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(G[0], G[1]), G[2]), G[3]);
        const __m512 hi = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(G[4], G[5]), G[6]), G[7]);
        y = _mm512_add_ps(lo, hi);
        if (n0 + 16 > n4) {
            const __m512 e = _mm512_add_ps(_mm512_add_ps(G[4], G[0]), _mm512_add_ps(G[6], G[2]));
            const __m512 o = _mm512_add_ps(_mm512_add_ps(G[5], G[1]), _mm512_add_ps(G[7], G[3]));
            const int keep = n4 - n0 > 0 ? n4 - n0 : 0;
            y = _mm512_mask_blend_ps((__mmask16)(0xFFFFu << keep), y, _mm512_add_ps(e, o));
        }
    } else {
        if (bs == 64) {
            for (ptrdiff_t b = 0; b < (kb & ~1); b++) {
                BLOCK_HEAD(b)
                const int beta = b & 1;
                const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(sp + (size_t)b * 16), _mm512_set1_ps(asc[b]));
                UNROLL for (int L = 0; L < 4; L++) {
                    F[4 * L + beta] = ch2(F[4 * L + beta], q, ab, 4 * L, 4 * L + 2, s);
                    F[4 * L + beta + 2] = ch2(F[4 * L + beta + 2], q, ab, 4 * L + 1, 4 * L + 3, s);
                }
            }
            if (kb & 1) { /* the last block of an odd count: one quad per chain */
                const int b = kb - 1;
                BLOCK_HEAD(b)
                const __m512 s = _mm512_mul_ps(_mm512_set1_ps(asc[b]), _mm512_loadu_ps(sp + (size_t)b * 16));
                UNROLL for (int j = 0; j < 16; j++) {
                    const __m512i x = dp(_mm512_setzero_si512(), quad_w(q, j), ab + 4 * j);
                    F[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), s, F[j]);
                }
            }
        } else { /* 128, 256: per 128 k values, chain j gets quads j and 16 + j */
            for (ptrdiff_t b = 0; b < kb; b++) {
                BLOCK_HEAD(b)
                const __m512 s = _mm512_mul_ps(_mm512_set1_ps(asc[b]), _mm512_loadu_ps(sp + (size_t)b * 16));
                for (int sb = 0; sb < bs / 128; sb++)
                    UNROLL for (int j = 0; j < 16; j++) F[j] = ch2(F[j], q + 1024 * sb, ab + 128 * sb, j, 16 + j, s);
            }
        }
        /* _mm512_reduce_add_ps / hsum_float_16 order; onnxruntime's odd last row (its 1-row kernel) folds
         * its first N & ~3 columns as FoldAccumulators does */
        __m512 h[8], t[4];
        UNROLL for (int j = 0; j < 8; j++) h[j] = _mm512_add_ps(F[j], F[j + 8]);
        UNROLL for (int i = 0; i < 4; i++) t[i] = _mm512_add_ps(h[4 + i], h[i]);
        y = _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]));
        if ((c->M & 1) && m == c->M - 1 && n0 < n4) {
            __m512 S[4];
            UNROLL for (int L = 0; L < 4; L++)
                S[L] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(F[4 * L], F[4 * L + 1]), F[4 * L + 2]), F[4 * L + 3]);
            const __m512 fy = _mm512_add_ps(_mm512_add_ps(S[0], S[2]), _mm512_add_ps(S[1], S[3]));
            const int keep = n4 - n0 >= 16 ? 16 : n4 - n0;
            y = _mm512_mask_blend_ps((__mmask16)((1u << keep) - 1u), y, fy);
        }
    }
#undef BLOCK_HEAD
    i8_store(c, m, p, y, z);
}

/* fp32 for M >= 4: weights of up to KCH k values of two panels are dequantized once to L1,
 * w = (q - zero_point) * scale, then 8-row tiles stream over them with plain FMAs; y holds the partial
 * sums between chunks. The dequantization is amortized over every row of the task. A is copied by
 * prep_avx512 into tiles of TF = 8 rows (tile t at af + 8t * kpad, value (k, row r) at +8k + r), so one
 * pointer feeds the 8 broadcasts of a k step (8 row pointers took every spare register). */
#define KCH 256
#define TF 8

NB_INLINE int f_tile_h(const nb_call *c)
{
    return c->mode == NB_MODE_F32 && c->M >= 4 ? TF : 1;
}

/* pf: also prefetch (into L2) the same chunk two panels on, which the task dequantizes after this pair:
 * without it every chunk of a panel pair waits for memory (1 thread, load ~5, M=16 K=1024: N=32000
 * 6.3 -> 4.85 ms, N=5632 806-950 -> 801-816 us, N=3072 -2 %) */
NB_INLINE void deq_chunk(const nb_weights *w, int p, int b0, int nb, float *dst, int pf)
{
    const int cpb = w->bs / 8;
    const uint8_t *qp = w->qw + ((size_t)p * w->kc + (size_t)b0 * cpb) * 64;
    const size_t ahead = (size_t)2 * w->kc * 64;
    /* nibble -> float by vpermps (the low 4 bits of a lane index {0, ..., 15}): no and, no cvt */
    const __m512 lut = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f);
    for (ptrdiff_t b = 0; b < nb; b++) {
        const __m512 s = _mm512_loadu_ps(w->sc + ((size_t)p * w->kb + b0 + b) * 16), z = zp_vec(w, p, b0 + b);
        const __m512 nzs = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), z), s);
        for (int ci = 0; ci < cpb; ci++, qp += 64, dst += 128) {
            if (pf) _mm_prefetch((const char *)qp + ahead, _MM_HINT_T1);
            const __m512i v = _mm512_loadu_si512((const void *)qp);
            UNROLL for (int j = 0; j < 8; j++) {
                const __m512 q = _mm512_permutexvar_ps(j ? _mm512_srli_epi32(v, 4 * NB_KPOS(j)) : v, lut);
                _mm512_storeu_ps(dst + 16 * j, _mm512_fmadd_ps(q, s, nzs));
            }
        }
    }
}

NB_INLINE __mmask16 panel_mask(const nb_call *c, int p)
{
    const int ncols = c->w.N - 16 * p < 16 ? c->w.N - 16 * p : 16;
    return (__mmask16)((1u << ncols) - 1u);
}

NB_INLINE void fma_tile(const nb_call *c, const float *w0, const float *w1, int k0, int klen, int m, int p,
                        int first, int last, const int R, const int TWO)
{
    const int N = c->w.N;
    const __mmask16 k0m = panel_mask(c, p), k1m = TWO ? panel_mask(c, p + 1) : 0;
    __m512 acc[TF][2];
    const float *ap = c->af + (size_t)m * c->kpad + (size_t)k0 * TF;
    UNROLL for (int r = 0; r < R; r++) {
        float *y = c->y + (size_t)(m + r) * N + 16 * p;
        acc[r][0] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(k0m, y);
        if (TWO) acc[r][1] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(k1m, y + 16);
    }
    const float *const aend = ap + (size_t)klen * TF;
    _Pragma("GCC unroll 4") for (; ap < aend; ap += TF, w0 += 16, w1 += 16) {
        const __m512 a0 = _mm512_loadu_ps(w0);
        const __m512 a1 = TWO ? _mm512_loadu_ps(w1) : a0;
        UNROLL for (int r = 0; r < R; r++) {
            const __m512 b = _mm512_set1_ps(ap[r]);
            acc[r][0] = _mm512_fmadd_ps(a0, b, acc[r][0]);
            if (TWO) acc[r][1] = _mm512_fmadd_ps(a1, b, acc[r][1]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        float *y = c->y + (size_t)(m + r) * N + 16 * p;
        __m512 v0 = acc[r][0];
        if (last && c->bias) v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(k0m, c->bias + 16 * p));
        _mm512_mask_storeu_ps(y, k0m, v0);
        if (TWO) {
            __m512 v1 = acc[r][1];
            if (last && c->bias) v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(k1m, c->bias + 16 * p + 16));
            _mm512_mask_storeu_ps(y + 16, k1m, v1);
        }
    }
}

#define FMA_CASES(TWO)                                                                                 \
    switch (R) {                                                                                       \
    case 8: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 8, TWO); break;                   \
    case 7: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 7, TWO); break;                   \
    case 6: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 6, TWO); break;                   \
    case 5: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 5, TWO); break;                   \
    case 4: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 4, TWO); break;                   \
    case 3: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 3, TWO); break;                   \
    case 2: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 2, TWO); break;                   \
    default: fma_tile(c, buf[0], buf[1], k0, klen, m, p, first, last, 1, TWO); break;                  \
    }

static void gemm_f32_dequant(const nb_call *c, int m0, int m1, int p0, int p1)
{
    const nb_weights *w = &c->w;
    const int nbch = w->bs >= KCH ? 1 : KCH / w->bs;
    float buf[2][KCH * 16] __attribute__((aligned(64)));
    for (int p = p0; p < p1; p += 2) {
        const int two = p + 1 < p1;
        for (int b0 = 0; b0 < w->kb; b0 += nbch) {
            const int nb = w->kb - b0 < nbch ? w->kb - b0 : nbch;
            const int k0 = b0 * w->bs, klen = nb * w->bs, first = b0 == 0, last = b0 + nb == w->kb;
            deq_chunk(w, p, b0, nb, buf[0], p + 2 < p1);
            if (two) deq_chunk(w, p + 1, b0, nb, buf[1], p + 3 < p1);
            for (int m = m0; m < m1; m += TF) { /* m0 is a multiple of TF (module.c: row chunks of 32) */
                const int R = m1 - m < TF ? m1 - m : TF;
                if (two) {
                    FMA_CASES(1)
                } else {
                    FMA_CASES(0)
                }
            }
        }
    }
}

/* int8 for M >= 2, block 32: R <= 3 rows x NP <= 2 panels (gemm_i8 uses NP = 1). The 16 chains of an output do not fit in
 * registers for more than one output vector, but the blocks 4g + beta (one beta) feed only 4 of them
 * (nbits.h): one pass per beta over those blocks keeps 4 chains per row and panel live (16 for the tile);
 * each weight chunk, unpacked once, feeds R rows and each A broadcast NP panels. After each pass the
 * chains are parked in fb ([row][panel][chain][16 columns]); i8_end32 then adds the trailing blocks and
 * sums as i8_row32 does, with the zero-point term zterms computed for the task's rows (zb, [row][16], NP = 1).
 * H16 (4-row tiles whose scales pass scales_ok): the high nibbles meet A in place (v & 0xF0, 16 times the
 * quad's dot) instead of shifted down, so the high-nibble chains hold 16 times their sums, exactly (scales_ok)
 * until i8_end32 scales them back: 4 shifts fewer per block and panel. Measured (one thread, main's kernel
 * and this one alternating in one process, extension flags, min of 9-11 rounds): M=16 K=1024 N=5632 0.980,
 * N=32000 0.988, M=128 N=1024 0.977. */
#define TR 4

NB_INLINE void i8_end32(const nb_call *c, int m, int p, const float *f, __m512 z, const int H16)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, kb4 = kb & ~3;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const int8_t *a = c->aq + (size_t)m * c->kpad;
    const float *asc = c->ascale + (size_t)m * kb;
    const __m512i mask = _mm512_set1_epi8(15);
    __m512 G[8];
    UNROLL for (int j = 0; j < 8; j++) G[j] = _mm512_add_ps(_mm512_load_ps(f + 16 * j), _mm512_load_ps(f + 16 * (j + 8)));
    if (H16) /* the high-nibble chains (odd j) hold 16 times their sums (i8_tile32) */
        UNROLL for (int j = 1; j < 8; j += 2) G[j] = _mm512_mul_ps(G[j], _mm512_set1_ps(0.0625f));
    for (ptrdiff_t b = kb4; b < kb; b++) {
        const uint8_t *q = qp + (size_t)b * 256;
        const int8_t *ab = a + (size_t)b * 32;
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(asc[b]), _mm512_loadu_ps(sp + (size_t)b * 16));
        UNROLL for (int ci = 0; ci < 4; ci++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * ci));
            const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), mask);
            const __m512i z0 = _mm512_setzero_si512();
            G[2 * ci] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp(z0, lo, ab + 8 * ci)), s, G[2 * ci]);
            G[2 * ci + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp(z0, hi, ab + 8 * ci + 4)), s, G[2 * ci + 1]);
        }
    }
    const __m512 lo = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(G[0], G[1]), G[2]), G[3]);
    const __m512 hi = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(G[4], G[5]), G[6]), G[7]);
    __m512 y = _mm512_add_ps(lo, hi);
    const int n0 = 16 * p, n4 = w->N & ~3;
    if (n0 + 16 > n4) {
        const __m512 e = _mm512_add_ps(_mm512_add_ps(G[4], G[0]), _mm512_add_ps(G[6], G[2]));
        const __m512 o = _mm512_add_ps(_mm512_add_ps(G[5], G[1]), _mm512_add_ps(G[7], G[3]));
        const int keep = n4 - n0 > 0 ? n4 - n0 : 0;
        y = _mm512_mask_blend_ps((__mmask16)(0xFFFFu << keep), y, _mm512_add_ps(e, o));
    }
    i8_store(c, m, p, y, z);
}

NB_INLINE void prefetchw(const char *p)
{
    __asm__ volatile("prefetchw %0" : : "m"(*p));
}

NB_INLINE void i8_tile32(const nb_call *c, int m, int p, const int R, const int NP, const float *zb, int pf,
                         const int H16)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, kb4 = kb & ~3;
    const size_t pstr = (size_t)w->kc * 64;
    const uint8_t *qp = w->qw + (size_t)p * pstr;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const __m512i mask = _mm512_set1_epi8(15), mhi = _mm512_set1_epi8((char)0xF0);
    float fb[TR][2][16][16] __attribute__((aligned(64)));
    const int8_t *a[TR];
    const float *asc[TR];
    UNROLL for (int r = 0; r < R; r++) {
        a[r] = c->aq + (size_t)(m + r) * c->kpad;
        asc[r] = c->ascale + (size_t)(m + r) * kb;
        /* the tile's outputs, stored at its end: for writing into L1 now (a store that misses holds the
         * store queue, and every store after it, for a memory latency) */
        UNROLL for (int h = 0; h < NP; h++) {
            const char *yp = (const char *)(c->y + (size_t)(m + r) * w->N + 16 * (p + h));
            prefetchw(yp);
            prefetchw(yp + 63);
        }
    }
    _Pragma("GCC unroll 1") for (int beta = 0; beta < 4; beta++) { /* unrolled: 10 % slower (code size) */
        __m512 F[TR][2][4];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int h = 0; h < NP; h++) UNROLL for (int i = 0; i < 4; i++)
            F[r][h][i] = _mm512_setzero_ps();
        _Pragma("GCC unroll 2") for (ptrdiff_t b = beta; b < kb4; b += 4) {
            const uint8_t *q = qp + (size_t)b * 256;
            if ((pf & 1) && beta == 0) /* the group of 4 blocks two groups ahead (then the next panel's start) */
                UNROLL for (int l = 0; l < 16; l++) _mm_prefetch((const char *)q + 2048 + 64 * l, _MM_HINT_T0);
            if (pf & 2) { /* the next panel's block b and its scales, spread over the four passes (gemm_i8) */
                UNROLL for (int l = 0; l < 4; l++) _mm_prefetch((const char *)q + pstr + 64 * l, _MM_HINT_T0);
                _mm_prefetch((const char *)(sp + ((size_t)kb + b) * 16), _MM_HINT_T0);
            }
            __m512 s[TR][2];
            UNROLL for (int h = 0; h < NP; h++) {
                const __m512 sb = _mm512_loadu_ps(sp + ((size_t)h * kb + b) * 16);
                UNROLL for (int r = 0; r < R; r++) s[r][h] = _mm512_mul_ps(sb, _mm512_set1_ps(asc[r][b]));
            }
            UNROLL for (int pr = 0; pr < 2; pr++) { /* chunks 2pr, 2pr + 1: chains 2pr (low) and 2pr + 1 (high) */
                UNROLL for (int hi = 0; hi < 2; hi++) {
                    __m512i w0[2], w1[2];
                    UNROLL for (int h = 0; h < NP; h++) {
                        const __m512i v0 = _mm512_loadu_si512((const void *)(q + h * pstr + 128 * pr));
                        const __m512i v1 = _mm512_loadu_si512((const void *)(q + h * pstr + 128 * pr + 64));
                        if (H16) { /* the high nibbles in place: 16 times their dot */
                            w0[h] = _mm512_and_si512(v0, hi ? mhi : mask);
                            w1[h] = _mm512_and_si512(v1, hi ? mhi : mask);
                        } else {
                            w0[h] = hi ? _mm512_and_si512(_mm512_srli_epi32(v0, 4), mask) : _mm512_and_si512(v0, mask);
                            w1[h] = hi ? _mm512_and_si512(_mm512_srli_epi32(v1, 4), mask) : _mm512_and_si512(v1, mask);
                        }
                    }
                    UNROLL for (int r = 0; r < R; r++) {
                        const int8_t *ab = a[r] + (size_t)b * 32 + 16 * pr + 4 * hi;
                        UNROLL for (int h = 0; h < NP; h++) {
                            const __m512i x = dpm(dpm(_mm512_setzero_si512(), w0[h], ab), w1[h], ab + 8);
                            F[r][h][2 * pr + hi] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), s[r][h], F[r][h][2 * pr + hi]);
                        }
                    }
                }
            }
        }
        const int base = (beta & 1) * 8 + (beta >> 1) * 2;
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int h = 0; h < NP; h++) {
            _mm512_store_ps(fb[r][h][base], F[r][h][0]);
            _mm512_store_ps(fb[r][h][base + 1], F[r][h][1]);
            _mm512_store_ps(fb[r][h][base + 4], F[r][h][2]);
            _mm512_store_ps(fb[r][h][base + 5], F[r][h][3]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int h = 0; h < NP; h++)
        i8_end32(c, m + r, p + h, &fb[r][h][0][0], _mm512_load_ps(zb + 16 * (NP * r + h)), H16);
}

/* Whether every value of v[0..n) is 0 or has 2^-50 <= |v| <= 2^48 (so no NaN, infinity or subnormal): the
 * condition on both scale factors under which i8_tile32 may keep its high-nibble chains scaled by 16 (H16).
 * Then every scale product s = sb * sa is 0 or in [2^-100, 2^96], a multiple of 2^-123 like every
 * partial sum of a chain (the integer dot times s, plus such a sum, rounded: a multiple of 2^-123 stays
 * one), so no partial is subnormal and, with K below 2^17, none exceeds 2^120: multiplying a chain by 16
 * commutes with each of its roundings, and the chain sums F[j] + F[j + 8] times 1/16 are exactly the
 * unscaled ones (i8_end32). */
NB_INLINE int scales_ok(const float *v, size_t n)
{
    const __m512i lo = _mm512_set1_epi32(77 << 23), span = _mm512_set1_epi32((175 - 77) << 23);
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    __mmask16 bad = 0;
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 lm = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512i x = _mm512_and_si512(_mm512_maskz_loadu_epi32(lm, v + i), absm);
        /* x - 2^-50's bits above the span (unsigned), where x is not zero */
        bad |= _mm512_mask_cmpgt_epu32_mask(_mm512_test_epi32_mask(x, x), _mm512_sub_epi32(x, lo), span);
    }
    return bad == 0;
}

static void gemm_i8(const nb_call *c, int m0, int m1, int p0, int p1)
{
    if (c->w.bs != 32) {
        const int pf = c->M == 1;
        for (int p = p0; p < p1; p++)
            for (int m = m0; m < m1; m++) {
                if (pf)
                    i8_row_any(c, m, p, 1);
                else
                    i8_row_any(c, m, p, 0);
            }
        return;
    }
    if (c->M == 1) {
        for (int p = p0; p < p1; p++) i8_row32(c, m0, p, 1);
        return;
    }
    /* measured (M=96, K=1024, N=3072, one thread): R x NP = 3 x 1 2.28 ns per block, row and panel; 2 x 2
     * 2.37, 4 x 1 2.31, 3 x 2 2.27, 4 x 2 2.47, 1 x 1 (i8_row32) 2.9; then 2.40 -> 2.20 with the zero-point
     * chains of 8 rows side by side (zterms) instead of one row's after each tile; with zterms, 4 x 1 is
     * 4-7 % faster than 3 x 1 (two builds interleaved in one process, M = 16/96/128, K = 1024; 5 x 1 no
     * better than 4). The bound: vpdpbusd, FMA and MUL share two 512-bit pipes here (cvt and add do not),
     * 14 of them per block, row and panel (8 dot products, 4 chain FMAs, the scale product, the zero-point
     * FMA), so about 7 cycles; measured about 9 */
    /* NOTE (the Intel Xeon VM of 2026-12-04, AVX-512 VNNI + AMX, 2 vCPUs, one thread): there vpdpbusd,
     * vcvtdq2ps, FMA, MUL and AND all share ports 0 and 5 (timed loops of independent ops: 16 vpdpbusd 7.8
     * cycles, + 8 cvt or + 8 fma 11.6), so a 4 x 1 tile's 20 ops per block, row and panel (8 dot products,
     * 4 cvt, 4 chain FMAs, the scale product, 2 ANDs, the zero-point FMA) need 10 cycles; this kernel takes
     * 11.4 in L2 (M=16 K=1024 N=1024), 11.7-12.0 from L3 (N=5632, 32000), of which zterms ~0.8 (its loop
     * alone: 103.4 -> 96 us without it, not bit-exact; 16 rows' chains side by side instead of 8 were 1 %
     * slower). A stripped tile of the same ops in one pass over the blocks ran at 9.85 cycles (the 4 passes
     * cost it 6 % once the weights come from L3). AMX (TDPBSUD) does not pay for onnxruntime's order, which
     * needs 4 int32 dots per block, row and column (the quad pairs, nbits.h): 16-row TDPBSUD took ~33 cycles
     * here whatever its K (8-64), tilezero + TDPBSUD + tilestored 53-73; AMX for 2 of the 4 quad pairs alone
     * (A and unpacked-B tile loads, 2 TDPBSUD, 2 stores per block and 16 rows) cost 9.3 cycles per block, row
     * and panel, and the hybrid (VNNI for the other two) 15.8 interleaved, 19.2 a panel ahead, against 10.1
     * (prototype, K=1024 N=5632 M=16, bit-identical int32 dots; cycles = TSC ticks / 0.702, from 2 FMAs a
     * cycle). */
    /* pf of a tile: 1 (the first tile of a row chunk) prefetches its panel 2 KiB ahead; 3 (the first tile of
     * the task's rows, not the last panel) also the next panel, whose first tile otherwise waits for memory
     * (1 thread, load ~1.5, K=1024 N=32000: M=16 3099 -> 2791 us, M=128 22.0 -> 21.7 ms; N=3072 and
     * 2816x1024 within 1-2 %) */
    float zb[ZROWS * 16] __attribute__((aligned(64)));
    /* H16 (scales_ok): the task's activation scales, then each panel's weight scales */
    const int a_ok = c->w.K < (1 << 17) && scales_ok(c->ascale + (size_t)m0 * c->w.kb, (size_t)(m1 - m0) * c->w.kb);
    for (int p = p0; p < p1; p++) {
        const int h16 = a_ok && scales_ok(c->w.sc + (size_t)p * c->w.kb * 16, (size_t)c->w.kb * 16);
        for (int mc = m0; mc < m1; mc += ZROWS) {
            const int me = m1 - mc < ZROWS ? m1 : mc + ZROWS;
            for (int r = mc; r < me; r += 8) zterms(c, r, me - r < 8 ? me - r : 8, p, zb + 16 * (r - mc));
            for (int m = mc; m < me; m += TR) {
                switch (me - m < TR ? me - m : TR) {
                case 4:
                    if (h16)
                        i8_tile32(c, m, p, 4, 1, zb + 16 * (m - mc), m == mc ? (mc == m0 && p + 1 < p1 ? 3 : 1) : 0, 1);
                    else
                        i8_tile32(c, m, p, 4, 1, zb + 16 * (m - mc), m == mc ? (mc == m0 && p + 1 < p1 ? 3 : 1) : 0, 0);
                    break;
                case 3: i8_tile32(c, m, p, 3, 1, zb + 16 * (m - mc), m == mc ? (mc == m0 && p + 1 < p1 ? 3 : 1) : 0, 0); break;
                case 2: i8_tile32(c, m, p, 2, 1, zb + 16 * (m - mc), m == mc ? (mc == m0 && p + 1 < p1 ? 3 : 1) : 0, 0); break;
                default: i8_row32(c, m, p, 0); break;
                }
            }
        }
    }
}

/* fp32 by int8 digits (NB_MODE_F32_DIGITS, nbits.h), R <= 3 rows x one panel, block 16 or 32: per chunk the
 * low and high nibble vectors meet each row's three digit quads in vpdpbusd (two int32 accumulators per digit
 * and row, so a block's chains are 4 deep); per block X = (D1 << 14) + (D2 << 7) + D3, t = X - zp Z (exact),
 * y = fma((float)t, sb * s3, y). 24 vpdpbusd per block, row and panel against f32_tile's 32 vpermps and 32
 * fma (which share Zen 4's two 512-bit pipes with them, one each per cycle): M=1, one thread, the two
 * interleaved in one process (set_f32_digits), AMD Zen 4, load ~2-3: K=1024 N=3072 106 -> 60 us, N=1024
 * 42 -> 23, N=5632 191 -> 97, N=32000 1216 -> 548, K=2816 N=1024 97 -> 51; M=2 1.2-2.1x, M=3 1.0-1.2x.
 * Not from M=4: there the dequantizing kernel (gemm_f32_dequant) gives onnxruntime's fp32 bits (its dequantize
 * + SGEMM order; tests/generate/test_bit_exact_llm.py holds a level-0 prefill to them), which the digits do
 * not, although they were faster there too (tiles of 4 rows, one thread, load ~5: M=4 1.8-2.0x, M=16
 * 1.22-1.32x, M=128 1.19-1.20x over the five benchmark shapes). f32_tile (M <= 3) was not onnxruntime's bits
 * either (up to ~2e-5 apart at K=1024). */
NB_INLINE void f32d_tile(const nb_call *c, int m, int p, const int R, const int PF)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, cpb = w->bs / 8;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const __m512i mask = _mm512_set1_epi8(15);
    const int8_t *a[3];
    const float *s3[3];
    const int32_t *zs[3];
    __m512 y[3];
    UNROLL for (int r = 0; r < R; r++) {
        a[r] = c->aq + (size_t)(m + r) * 3 * c->kpad;
        s3[r] = c->ascale + (size_t)(m + r) * kb;
        zs[r] = (const int32_t *)(const void *)(c->asum + (size_t)(m + r) * kb);
        y[r] = _mm512_setzero_ps();
    }
    for (ptrdiff_t b = 0; b < kb; b++) {
        const uint8_t *q = qp + (size_t)b * cpb * 64;
        if (PF) {
            _mm_prefetch((const char *)(sp + (size_t)(b + PF_BLOCKS) * 16), _MM_HINT_T0);
            for (int ci = 0; ci < cpb; ci++) _mm_prefetch((const char *)q + 64 * ci + PF_BYTES, PF_HINT);
        }
        __m512i acc[3][3][2];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int d = 0; d < 3; d++) {
            acc[r][d][0] = _mm512_setzero_si512();
            acc[r][d][1] = _mm512_setzero_si512();
        }
        for (int ci = 0; ci < cpb; ci++) {
            __m512i lo, hi;
            ld_chunk(q, ci, &lo, &hi);
            const size_t k = (size_t)b * w->bs + 8 * (size_t)ci;
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int d = 0; d < 3; d++) {
                const int8_t *ad = a[r] + (size_t)d * c->kpad + k;
                acc[r][d][0] = dpm(acc[r][d][0], lo, ad);
                acc[r][d][1] = dpm(acc[r][d][1], hi, ad + 4);
            }
        }
        const __m512 sb = _mm512_loadu_ps(sp + (size_t)b * 16);
        __m512i zpi = _mm512_setzero_si512();
        if (w->zp_kind == NB_ZP_U4) {
            const __m128i x = _mm_loadl_epi64((const __m128i *)(w->zpn + ((size_t)p * kb + b) * 8));
            const __m128i m4 = _mm_set1_epi8(15);
            zpi = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4)));
        }
        UNROLL for (int r = 0; r < R; r++) {
            const __m512i d1 = _mm512_add_epi32(acc[r][0][0], acc[r][0][1]);
            const __m512i d2 = _mm512_add_epi32(acc[r][1][0], acc[r][1][1]);
            const __m512i d3 = _mm512_add_epi32(acc[r][2][0], acc[r][2][1]);
            __m512i x = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(d1, 14), _mm512_slli_epi32(d2, 7)), d3);
            x = _mm512_sub_epi32(x, w->zp_kind == NB_ZP_U4 ? _mm512_mullo_epi32(zpi, _mm512_set1_epi32(zs[r][b]))
                                                          : _mm512_set1_epi32(8 * zs[r][b]));
            y[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), _mm512_mul_ps(sb, _mm512_set1_ps(s3[r][b])), y[r]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) store_row(c, m + r, p, y[r]);
}

static void gemm_f32d(const nb_call *c, int m0, int m1, int p0, int p1)
{
    const int pf = c->M == 1;
    for (int p = p0; p < p1; p++)
        for (int m = m0; m < m1; m += 3) {
            switch (m1 - m < 3 ? m1 - m : 3) {
            case 3: f32d_tile(c, m, p, 3, 0); break;
            case 2: f32d_tile(c, m, p, 2, 0); break;
            default:
                if (pf)
                    f32d_tile(c, m, p, 1, 1);
                else
                    f32d_tile(c, m, p, 1, 0);
                break;
            }
        }
}

/* Phase 1 of NB_MODE_F32_DIGITS: each block of rows m0..m1-1 as three int8 digits (nbits.h): d1 = rint(a * 127
 * / amax), then d2 and d3 of the remainders (fnmadd, exact but for one rounding) at 128 and 16384 times that
 * scale; |d2|, |d3| <= 64. Returns 0 when some block maximum is not finite or is in (0, 2^-100). */
static int digits_prep_avx512(const nb_call *c, int m0, int m1)
{
    const int K = c->w.K, bs = c->w.bs, kb = c->w.kb, kpad = c->kpad, segs = bs / 16;
    for (int m = m0; m < m1; m++) {
        const float *a = c->a + (size_t)m * K;
        int8_t *q1 = c->aq + (size_t)m * 3 * kpad, *q2 = q1 + kpad, *q3 = q2 + kpad;
        float *s3 = c->ascale + (size_t)m * kb;
        int32_t *zs = (int32_t *)(void *)(c->asum + (size_t)m * kb);
        for (ptrdiff_t b = 0; b < kb; b++) {
            __m512 x[2];
            __m512 mx = _mm512_setzero_ps();
            for (int i = 0; i < segs; i++) {
                const int k = b * bs + 16 * i;
                const __mmask16 lm = k + 16 <= K ? (__mmask16)0xFFFF : k >= K ? 0 : (__mmask16)((1u << (K - k)) - 1u);
                x[i] = _mm512_maskz_loadu_ps(lm, a + k);
                mx = _mm512_max_ps(mx, _mm512_abs_ps(x[i]));
            }
            /* max_ps returns its second operand when either is NaN: a NaN lane reaches amax through the sum */
            const float amax = _mm512_reduce_max_ps(mx);
            float nan_probe = 0.f;
            for (int i = 0; i < segs; i++) nan_probe += _mm512_reduce_add_ps(_mm512_mul_ps(x[i], _mm512_setzero_ps()));
            if (!(amax <= 3.4028235e38f) || nan_probe != 0.f || (amax > 0.f && amax < 0x1p-100f)) return 0;
            const float s1 = amax / 127.f, inv = amax != 0.f ? 127.f / amax : 0.f;
            s3[b] = s1 * 0x1p-14f;
            const __m512 vs1 = _mm512_set1_ps(s1), vs2 = _mm512_set1_ps(s1 * 0x1p-7f);
            const __m512 vi1 = _mm512_set1_ps(inv), vi2 = _mm512_set1_ps(inv * 128.f), vi3 = _mm512_set1_ps(inv * 16384.f);
            __m512i zsum = _mm512_setzero_si512();
            for (int i = 0; i < segs; i++) {
                const int k = b * bs + 16 * i;
                const __m512 f1 = _mm512_roundscale_ps(_mm512_mul_ps(x[i], vi1), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                const __m512 r1 = _mm512_fnmadd_ps(f1, vs1, x[i]);
                const __m512 f2 = _mm512_roundscale_ps(_mm512_mul_ps(r1, vi2), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                const __m512 r2 = _mm512_fnmadd_ps(f2, vs2, r1);
                const __m512i d1 = _mm512_cvtps_epi32(f1), d2 = _mm512_cvtps_epi32(f2);
                const __m512i d3 = _mm512_cvtps_epi32(_mm512_mul_ps(r2, vi3));
                _mm_storeu_si128((__m128i *)(void *)(q1 + k), _mm512_cvtsepi32_epi8(d1));
                _mm_storeu_si128((__m128i *)(void *)(q2 + k), _mm512_cvtsepi32_epi8(d2));
                _mm_storeu_si128((__m128i *)(void *)(q3 + k), _mm512_cvtsepi32_epi8(d3));
                zsum = _mm512_add_epi32(zsum, _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(d1, 14),
                                                                                 _mm512_slli_epi32(d2, 7)), d3));
            }
            zs[b] = _mm512_reduce_add_epi32(zsum);
        }
    }
    return 1;
}

static void gemm_avx512(const nb_call *c, int m0, int m1, int p0, int p1)
{
    if (c->mode == NB_MODE_F32_DIGITS) {
        gemm_f32d(c, m0, m1, p0, p1);
        return;
    }
    if (c->mode >= NB_MODE_I8_AVX2) { /* MLAS's AVX2 order (forced on this CPU) or ours: the AVX2 kernels */
        nb_isa_avx2.gemm(c, m0, m1, p0, p1);
        return;
    }
    if (c->mode == NB_MODE_I8) {
        gemm_i8(c, m0, m1, p0, p1);
        return;
    }
    if (f_tile_h(c) == TF) {
        gemm_f32_dequant(c, m0, m1, p0, p1);
        return;
    }
    for (int p = p0; p < p1; p++) {
        int m = m0;
        for (; m + 4 <= m1; m += 4) f32_tile(c, p, m, 4, 2);
        switch (m1 - m) {
        case 3: f32_tile(c, p, m, 3, 2); break;
        case 2: f32_tile(c, p, m, 2, 2); break;
        case 1: f32_tile(c, p, m, 1, 8); break;
        default: break;
        }
    }
}

/* Phase 1 vectorized: 16 k values per step, lanes past K masked to zero (which is the padding).
 * int8: bit-identical to nb_prep_rows (the same max, division, multiply; cvtps rounds half to even
 * under the default MXCSR), stored row-major in k order.
 * fp32: A is used in place when K is a multiple of the block (module.c points af at it), and the
 * block sums are accumulated in 16 lanes (a different summation order than the scalar path: the sum
 * only scales the zero-point term). */
#ifndef PREP_PF
#define PREP_PF 1024
#endif

/* 16 vectors -> one: lane 4L + e is the reduction (max, or int32 add) of v[4e + L] (any order is exact) */
#define RED16(T, OP, v, out)                                                                              \
    do {                                                                                                  \
        __m512 r_[8], s_[4], t_[2];                                                                       \
        UNROLL for (int j_ = 0; j_ < 8; j_++)                                                             \
            r_[j_] = OP(_mm512_shuffle_f32x4(v[2 * j_], v[2 * j_ + 1], 0x44),                             \
                        _mm512_shuffle_f32x4(v[2 * j_], v[2 * j_ + 1], 0xEE));                            \
        UNROLL for (int j_ = 0; j_ < 4; j_++)                                                             \
            s_[j_] = OP(_mm512_shuffle_f32x4(r_[2 * j_], r_[2 * j_ + 1], 0x88),                           \
                        _mm512_shuffle_f32x4(r_[2 * j_], r_[2 * j_ + 1], 0xDD));                          \
        UNROLL for (int j_ = 0; j_ < 2; j_++)                                                             \
            t_[j_] = OP(_mm512_unpacklo_ps(s_[2 * j_], s_[2 * j_ + 1]), _mm512_unpackhi_ps(s_[2 * j_], s_[2 * j_ + 1])); \
        out = OP(_mm512_shuffle_ps(t_[0], t_[1], _MM_SHUFFLE(1, 0, 1, 0)),                                \
                 _mm512_shuffle_ps(t_[0], t_[1], _MM_SHUFFLE(3, 2, 3, 2)));                               \
    } while (0)
NB_INLINE __m512 max_ps_(__m512 x, __m512 y) { return _mm512_max_ps(x, y); }
NB_INLINE __m512 add_i32_(__m512 x, __m512 y)
{
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(x), _mm512_castps_si512(y)));
}

/* int8 A quantization of 16 whole blocks of row a (from block b0): the block maxima and sums of 16 blocks
 * reduced side by side (RED16), the scales in one vector division; the same operations per value as the
 * one-block path (max and int32 sums are exact in any order), so the same bits */
NB_INLINE void prep_i8_16(const float *a, const int bs, int b0, int8_t *aq, float *ascale, float *asum, float zmul)
{
    const int segs = bs / 16;
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 v[16];
    UNROLL for (int i = 0; i < 16; i++) {
        const float *x = a + (size_t)(b0 + i) * bs;
        _mm_prefetch((const char *)x + PREP_PF, _MM_HINT_T0);
        __m512 mx = _mm512_abs_ps(_mm512_loadu_ps(x));
        for (int j = 1; j < segs; j++) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * j)));
        v[i] = mx;
    }
    __m512 amax;
    RED16(__m512, max_ps_, v, amax);
    amax = _mm512_permutexvar_ps(perm, amax); /* block order */
    const __mmask16 nz = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    const __m512 vsc = _mm512_div_ps(amax, _mm512_set1_ps(127.f));
    float inv[16] __attribute__((aligned(64)));
    _mm512_store_ps(inv, _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.f), amax));
    _mm512_storeu_ps(ascale + b0, vsc);
    UNROLL for (int i = 0; i < 16; i++) {
        const float *x = a + (size_t)(b0 + i) * bs;
        int8_t *q8 = aq + (size_t)(b0 + i) * bs;
        const __m512 vi = _mm512_set1_ps(inv[i]);
        __m512i qs = _mm512_setzero_si512();
        for (int j = 0; j < segs; j++) {
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), vi));
            qs = _mm512_add_epi32(qs, q);
            _mm_storeu_si128((__m128i *)(void *)(q8 + 16 * j), _mm512_cvtepi32_epi8(q));
        }
        v[i] = _mm512_castsi512_ps(qs);
    }
    __m512 sum;
    RED16(__m512, add_i32_, v, sum);
    sum = _mm512_permutexvar_ps(perm, sum);
    _mm512_storeu_ps(asum + b0, _mm512_mul_ps(_mm512_mul_ps(vsc, _mm512_cvtepi32_ps(_mm512_castps_si512(sum))),
                                             _mm512_set1_ps(zmul)));
}

static void prep_avx512(const nb_call *c, int m0, int m1)
{
    if (c->mode >= NB_MODE_I8_AVX2) {
        nb_isa_avx2.prep(c, m0, m1);
        return;
    }
    const int K = c->w.K, bs = c->w.bs, kb = c->w.kb, kpad = c->kpad, segs = bs / 16;
    const float zmul = c->w.zp_kind == NB_ZP_NONE ? 8.f : 1.f;
    for (int m = m0; m < m1; m++) {
        const float *a = c->a + (size_t)m * K;
        float *asum = c->asum + (size_t)m * kb;
        if (c->mode == NB_MODE_F32 && f_tile_h(c) == TF) {
            const int r = m % TF;
            float *af = c->af + (size_t)(m - r) * kpad + r;
            for (ptrdiff_t b = 0; b < kb; b++) {
                __m512 s = _mm512_setzero_ps();
                for (int i = 0; i < segs; i++) {
                    const int k = b * bs + 16 * i;
                    const __mmask16 lm = k + 16 <= K ? (__mmask16)0xFFFF : k >= K ? 0 : (__mmask16)((1u << (K - k)) - 1u);
                    const __m512 x = _mm512_maskz_loadu_ps(lm, a + k);
                    s = _mm512_add_ps(s, x);
                    float t[16];
                    _mm512_storeu_ps(t, x);
                    UNROLL for (int l = 0; l < 16; l++) af[(size_t)(k + l) * TF] = t[l];
                }
                asum[b] = _mm512_reduce_add_ps(s);
            }
            continue;
        }
        if (c->mode == NB_MODE_F32) {
            float *af = c->af + (size_t)m * kpad;
            for (ptrdiff_t b = 0; b < kb; b++) {
                __m512 s = _mm512_setzero_ps();
                for (int i = 0; i < segs; i++) {
                    const int k = b * bs + 16 * i;
                    const __mmask16 lm = k + 16 <= K ? (__mmask16)0xFFFF : k >= K ? 0 : (__mmask16)((1u << (K - k)) - 1u);
                    const __m512 x = _mm512_maskz_loadu_ps(lm, a + k);
                    s = _mm512_add_ps(s, x);
                    if (af != a) _mm512_storeu_ps(af + k, x);
                }
                asum[b] = _mm512_reduce_add_ps(s);
            }
            continue;
        }
        int8_t *aq = c->aq + (size_t)m * kpad;
        float *ascale = c->ascale + (size_t)m * kb;
        const int kbf = K / bs; /* whole blocks: unmasked loads */
        ptrdiff_t b = 0;
        if (bs == 32)
            for (; b + 16 <= kbf; b += 16) prep_i8_16(a, 32, b, aq, ascale, asum, zmul);
        else
            for (; b + 16 <= kbf; b += 16) prep_i8_16(a, bs, b, aq, ascale, asum, zmul);
        for (; b < kb; b++) {
            const int k0 = b * bs;
            const int full = b < kbf;
            _mm_prefetch((const char *)(a + k0) + PREP_PF, _MM_HINT_T0);
            if (bs >= 32) _mm_prefetch((const char *)(a + k0) + PREP_PF + 64, _MM_HINT_T0);
            __m512 mx = _mm512_setzero_ps();
            for (int i = 0; i < segs; i++) {
                const int k = k0 + 16 * i;
                const __mmask16 lm = full || k + 16 <= K ? (__mmask16)0xFFFF : k >= K ? 0 : (__mmask16)((1u << (K - k)) - 1u);
                const __m512 x = full ? _mm512_loadu_ps(a + k) : _mm512_maskz_loadu_ps(lm, a + k);
                mx = _mm512_max_ps(mx, _mm512_abs_ps(x));
            }
            const float amax = _mm512_reduce_max_ps(mx);
            const float inv = amax != 0.f ? 127.f / amax : 0.f;
            const __m512 vinv = _mm512_set1_ps(inv);
            const float sc = amax / 127.f;
            ascale[b] = sc;
            __m512i qs = _mm512_setzero_si512();
            for (int i = 0; i < segs; i++) {
                const int k = k0 + 16 * i;
                const __mmask16 lm = full || k + 16 <= K ? (__mmask16)0xFFFF : k >= K ? 0 : (__mmask16)((1u << (K - k)) - 1u);
                const __m512 x = full ? _mm512_loadu_ps(a + k) : _mm512_maskz_loadu_ps(lm, a + k);
                const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, vinv));
                qs = _mm512_add_epi32(qs, q);
                _mm_storeu_si128((__m128i *)(void *)(aq + k), _mm512_cvtepi32_epi8(q));
            }
            asum[b] = sc * (float)_mm512_reduce_add_epi32(qs) * zmul;
        }
    }
}

/* i8_rows 128: a panel's weights come from memory once for 128 rows (32-row tasks read each panel once per
 * chunk: 1 thread, K=1024 N=32000 M=128 24.0 -> 22.2 ms, N=3072 1877 -> 1855 us) */
const nb_isa nb_isa_avx512vnni = {"avx512vnni", prep_avx512, gemm_avx512, 4, 128, 3, digits_prep_avx512};

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
