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
    for (int b = 0; b < w->kb; b++) {
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
            UNROLL for (int j = 1; j < 8; j++) q[j] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * j), lut);
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

/* int8 (accuracy_level 4): vpdpbusd of the weight nibbles (u8) with the quantized A (s8) */
NB_INLINE void i8_tile(const nb_call *c, int p, int m, const int R, const int A)
{
    const nb_weights *w = &c->w;
    const int cpb = w->bs / 8;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * w->kb * 16;
    const __m512i mask = _mm512_set1_epi8(15);
    const int8_t *aq[4];
    const float *as[4], *asc[4];
    __m512 yacc[4];
    UNROLL for (int r = 0; r < R; r++) {
        aq[r] = c->aq + (size_t)(m + r) * c->kpad;
        as[r] = c->asum + (size_t)(m + r) * w->kb;
        asc[r] = c->ascale + (size_t)(m + r) * w->kb;
        yacc[r] = _mm512_setzero_ps();
    }
    for (int b = 0; b < w->kb; b++) {
        __m512i acc[4][4];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int a = 0; a < 2 * A; a++) acc[r][a] = _mm512_setzero_si512();
        int ci = 0;
        if (R == 1) _mm_prefetch((const char *)(sp + (size_t)(b + PF_BLOCKS) * 16), _MM_HINT_T0);
        for (; ci < cpb; ci += A, qp += 64 * A) {
            UNROLL for (int a = 0; a < A; a++) {
                if (R == 1) _mm_prefetch((const char *)(qp + 64 * a) + PF_BYTES, PF_HINT);
                const __m512i v = _mm512_loadu_si512((const void *)(qp + 64 * a));
                const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), mask);
                const int k = b * w->bs + 8 * (ci + a);
                UNROLL for (int r = 0; r < R; r++) {
                    int32_t e, o;
                    memcpy(&e, aq[r] + k, 4);
                    memcpy(&o, aq[r] + k + 4, 4);
                    acc[r][2 * a] = _mm512_dpbusd_epi32(acc[r][2 * a], lo, _mm512_set1_epi32(e));
                    acc[r][2 * a + 1] = _mm512_dpbusd_epi32(acc[r][2 * a + 1], hi, _mm512_set1_epi32(o));
                }
            }
        }
        const __m512 s = _mm512_loadu_ps(sp + (size_t)b * 16), z = zp_vec(w, p, b);
        UNROLL for (int r = 0; r < R; r++) {
            __m512i t = acc[r][0];
            UNROLL for (int a = 1; a < 2 * A; a++) t = _mm512_add_epi32(t, acc[r][a]);
            const __m512 f = _mm512_fnmadd_ps(z, _mm512_set1_ps(as[r][b]), _mm512_cvtepi32_ps(t));
            yacc[r] = _mm512_fmadd_ps(f, _mm512_mul_ps(s, _mm512_set1_ps(asc[r][b])), yacc[r]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) store_row(c, m + r, p, yacc[r]);
}

/* int8 for M >= 2: A is stored in tiles of TH = 4 rows (prep_avx512): tile t (rows 4t..4t+3) starts at
 * aq + 4t * kpad, chunk g (8 k values) at +32g, row r's 8 bytes at +8r (k0 k2 k4 k6 | k1 k3 k5 k7), and the
 * tile's ascale and acorr at +4t * kb as [block][4]: one pointer feeds every broadcast of a tile (with one
 * pointer per row the kernel ran out of registers and spilled). M = 1 keeps the row-major layout (a tile
 * of height 1).
 * The tile is R <= 4 rows x NP <= 2 panels: 8 accumulators, each fed by the low- and the high-nibble
 * product (8 chains of 2 per chunk cover the 4-cycle vpdpbusd latency at 2 per cycle); per chunk 2 weight
 * loads and 8 broadcasts for 16 vpdpbusd (the 8-row x 1-panel tile needed 17 loads for 16, and load ports
 * were its limit). vpdpbusd shares the FMA pipes, so the block epilogue (cvt + fmsub + fmadd, the
 * zero-point term precomputed in acorr) costs 2 of every 10 pipe slots at block size 32.
 * CPB > 0 fixes the chunks per block at compile time (block sizes 16, 32, 64). */
#define TH 4

NB_INLINE int a_tile_h(const nb_call *c)
{
    return c->mode == NB_MODE_I8 && c->M >= 2 ? TH : 1;
}

NB_INLINE void i8_tile4(const nb_call *c, int p, int m, const int R, const int NP, const int CPB)
{
    const nb_weights *w = &c->w;
    const int cpb = CPB ? CPB : w->bs / 8;
    const size_t pstr = (size_t)w->kc * 64;
    const uint8_t *qp = w->qw + (size_t)p * pstr;
    const float *sp = w->sc + (size_t)p * w->kb * 16;
    const int8_t *ap = c->aq + (size_t)m * c->kpad;
    const float *tsc = c->ascale + (size_t)m * w->kb, *tac = c->acorr + (size_t)m * w->kb;
    const __m512i mask = _mm512_set1_epi8(15);
    const int sym = w->zp_kind == NB_ZP_NONE;
    __m512 yacc[TH][2];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int h = 0; h < NP; h++) yacc[r][h] = _mm512_setzero_ps();
    for (int b = 0; b < w->kb; b++) {
        __m512i acc[TH][2];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int h = 0; h < NP; h++) acc[r][h] = _mm512_setzero_si512();
        UNROLL for (int ci = 0; ci < cpb; ci++, qp += 64, ap += 8 * TH) {
            __m512i lo[2], hi[2];
            UNROLL for (int h = 0; h < NP; h++) {
                const __m512i v = _mm512_loadu_si512((const void *)(qp + h * pstr));
                lo[h] = _mm512_and_si512(v, mask);
                hi[h] = _mm512_and_si512(_mm512_srli_epi32(v, 4), mask);
            }
            UNROLL for (int r = 0; r < R; r++) {
                int32_t e, o;
                memcpy(&e, ap + 8 * r, 4);
                memcpy(&o, ap + 8 * r + 4, 4);
                const __m512i be = _mm512_set1_epi32(e), bo = _mm512_set1_epi32(o);
                UNROLL for (int h = 0; h < NP; h++) {
                    acc[r][h] = _mm512_dpbusd_epi32(acc[r][h], lo[h], be);
                    acc[r][h] = _mm512_dpbusd_epi32(acc[r][h], hi[h], bo);
                }
            }
        }
        __m512 s[2];
        UNROLL for (int h = 0; h < NP; h++) s[h] = _mm512_loadu_ps(sp + ((size_t)h * w->kb + b) * 16);
        if (sym) {
            UNROLL for (int r = 0; r < R; r++) {
                const __m512 asc = _mm512_set1_ps(tsc[b * TH + r]), ac = _mm512_set1_ps(tac[b * TH + r]);
                UNROLL for (int h = 0; h < NP; h++)
                    yacc[r][h] = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(acc[r][h]), asc, ac), s[h],
                                                 yacc[r][h]);
            }
        } else {
            __m512 z[2];
            UNROLL for (int h = 0; h < NP; h++) z[h] = zp_vec(w, p + h, b);
            UNROLL for (int r = 0; r < R; r++) {
                const __m512 asc = _mm512_set1_ps(tsc[b * TH + r]), ac = _mm512_set1_ps(tac[b * TH + r]);
                UNROLL for (int h = 0; h < NP; h++) {
                    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][h]), asc);
                    yacc[r][h] = _mm512_fmadd_ps(_mm512_fnmadd_ps(z[h], ac, t), s[h], yacc[r][h]);
                }
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int h = 0; h < NP; h++) store_row(c, m + r, p + h, yacc[r][h]);
}

#define I8_TILE_R(NP, CPB)                                                                              \
    switch (R) {                                                                                        \
    case 4: i8_tile4(c, p, m, 4, NP, CPB); break;                                                       \
    case 3: i8_tile4(c, p, m, 3, NP, CPB); break;                                                       \
    case 2: i8_tile4(c, p, m, 2, NP, CPB); break;                                                       \
    default: i8_tile4(c, p, m, 1, NP, CPB); break;                                                      \
    }
#define I8_TILE_NP(CPB)                                                                                 \
    if (np == 2) {                                                                                      \
        I8_TILE_R(2, CPB)                                                                               \
    } else {                                                                                            \
        I8_TILE_R(1, CPB)                                                                               \
    }

/* rows m0..m1 (m0 a multiple of TH: module.c splits rows in chunks of 32) x panels p0..p1 */
static void gemm_i8_tiles(const nb_call *c, int m0, int m1, int p0, int p1)
{
    for (int p = p0; p < p1; p += 2) {
        const int np = p + 1 < p1 ? 2 : 1;
        for (int m = m0; m < m1; m += TH) {
            const int R = m1 - m < TH ? m1 - m : TH;
            switch (c->w.bs) {
            case 16: I8_TILE_NP(2) break;
            case 32: I8_TILE_NP(4) break;
            case 64: I8_TILE_NP(8) break;
            default: I8_TILE_NP(0) break;
            }
        }
    }
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

NB_INLINE void deq_chunk(const nb_weights *w, int p, int b0, int nb, float *dst)
{
    const int cpb = w->bs / 8;
    const uint8_t *qp = w->qw + ((size_t)p * w->kc + (size_t)b0 * cpb) * 64;
    /* nibble -> float by vpermps (the low 4 bits of a lane index {0, ..., 15}): no and, no cvt */
    const __m512 lut = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f);
    for (int b = 0; b < nb; b++) {
        const __m512 s = _mm512_loadu_ps(w->sc + ((size_t)p * w->kb + b0 + b) * 16), z = zp_vec(w, p, b0 + b);
        const __m512 nzs = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), z), s);
        for (int ci = 0; ci < cpb; ci++, qp += 64, dst += 128) {
            const __m512i v = _mm512_loadu_si512((const void *)qp);
            UNROLL for (int j = 0; j < 8; j++) {
                const __m512 q = _mm512_permutexvar_ps(j ? _mm512_srli_epi32(v, 4 * j) : v, lut);
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
            deq_chunk(w, p, b0, nb, buf[0]);
            if (two) deq_chunk(w, p + 1, b0, nb, buf[1]);
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

static void gemm_avx512(const nb_call *c, int m0, int m1, int p0, int p1)
{
    if (f_tile_h(c) == TF) {
        gemm_f32_dequant(c, m0, m1, p0, p1);
        return;
    }
    if (c->mode == NB_MODE_I8 && c->M >= 2) {
        gemm_i8_tiles(c, m0, m1, p0, p1);
        return;
    }
    /* chunks per block (bs / 8) is even for every bs >= 16, so the 2-way split of i8_tile is exact */
    for (int p = p0; p < p1; p++) {
        int m = m0;
        if (c->mode == NB_MODE_F32) {
            for (; m + 4 <= m1; m += 4) f32_tile(c, p, m, 4, 2);
            switch (m1 - m) {
            case 3: f32_tile(c, p, m, 3, 2); break;
            case 2: f32_tile(c, p, m, 2, 2); break;
            case 1: f32_tile(c, p, m, 1, 8); break;
            default: break;
            }
        } else {
            for (; m + 4 <= m1; m += 4) i8_tile(c, p, m, 4, 1);
            switch (m1 - m) {
            case 3: i8_tile(c, p, m, 3, 1); break;
            case 2: i8_tile(c, p, m, 2, 1); break;
            case 1: i8_tile(c, p, m, 1, 2); break;
            default: break;
            }
        }
    }
}

/* Phase 1 vectorized: 16 k values per step, lanes past K masked to zero (which is the padding).
 * int8: bit-identical to nb_prep_rows (the same max, division, multiply; cvtps rounds half to even
 * under the default MXCSR); the 8-groups are reordered k0 k2 k4 k6 k1 k3 k5 k7 with one byte shuffle.
 * fp32: A is used in place when K is a multiple of the block (module.c points af at it), and the
 * block sums are accumulated in 16 lanes (a different summation order than the scalar path: the sum
 * only scales the zero-point term). */
static void prep_avx512(const nb_call *c, int m0, int m1)
{
    const int K = c->w.K, bs = c->w.bs, kb = c->w.kb, kpad = c->kpad, segs = bs / 16;
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const float zmul = c->w.zp_kind == NB_ZP_NONE ? 8.f : 1.f;
    for (int m = m0; m < m1; m++) {
        const float *a = c->a + (size_t)m * K;
        float *asum = c->asum + (size_t)m * kb;
        if (c->mode == NB_MODE_F32 && f_tile_h(c) == TF) {
            const int r = m % TF;
            float *af = c->af + (size_t)(m - r) * kpad + r;
            for (int b = 0; b < kb; b++) {
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
            for (int b = 0; b < kb; b++) {
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
        /* the tile layout of gemm_i8_tiles (th = 1: row-major) */
        const int th = a_tile_h(c), r = m % th, m_t = m - r;
        int8_t *aq = c->aq + (size_t)m_t * kpad + 8 * r;
        float *ascale = c->ascale + (size_t)m_t * kb + r, *acorr = c->acorr + (size_t)m_t * kb + r;
        for (int b = 0; b < kb; b++) {
            const int k0 = b * bs;
            __m512 mx = _mm512_setzero_ps();
            for (int i = 0; i < segs; i++) {
                const int k = k0 + 16 * i;
                const __mmask16 lm = k + 16 <= K ? (__mmask16)0xFFFF : k >= K ? 0 : (__mmask16)((1u << (K - k)) - 1u);
                mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(lm, a + k)));
            }
            const float amax = _mm512_reduce_max_ps(mx);
            const float inv = amax != 0.f ? 127.f / amax : 0.f;
            const __m512 vinv = _mm512_set1_ps(inv);
            const float sc = amax / 127.f;
            ascale[b * th] = sc;
            __m512i qs = _mm512_setzero_si512();
            for (int i = 0; i < segs; i++) {
                const int k = k0 + 16 * i;
                const __mmask16 lm = k + 16 <= K ? (__mmask16)0xFFFF : k >= K ? 0 : (__mmask16)((1u << (K - k)) - 1u);
                const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(lm, a + k), vinv));
                qs = _mm512_add_epi32(qs, q);
                /* 16 k values = 2 chunks of 8 bytes, th * 8 bytes apart */
                const __m128i g = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(q), order);
                int8_t *dst = aq + (size_t)(k / 8) * 8 * th;
                _mm_storel_epi64((__m128i *)(void *)dst, g);
                _mm_storel_epi64((__m128i *)(void *)(dst + 8 * th), _mm_unpackhi_epi64(g, g));
            }
            const int sum = _mm512_reduce_add_epi32(qs);
            asum[b] = (float)sum;
            acorr[b * th] = (float)sum * sc * zmul;
        }
    }
}

const nb_isa nb_isa_avx512vnni = {"avx512vnni", prep_avx512, gemm_avx512, 4};

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
