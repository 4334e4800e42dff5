/* The static-quantization ops of onnxruntime's QOperator models (kernels/qlinear.py, kernels/quantize.py),
 * in the roundings MLAS uses, so that every integer output is onnxruntime's.
 *
 * qconv: QLinearConv (and QGemm, as a 1x1 convolution) on prepacked centered int16 weights
 * ``[M, Kp]`` (``w - w_zp``, K = C/g * KH * KW rounded up to even, zero past K). Every image and group
 * is turned into int16 columns of ``x - x_zp`` ``[Kp, P16]`` (padding is the zero point, so 0; P16 = the
 * output pixels rounded up to 16, zero past P); two rows of columns interleaved into pairs of k multiply
 * a pair of a weight row in int32 (vpmaddwd: |sum| <= 2 * 255 * 255, never saturated), summed in int32:
 * the exact integer the ONNX definition states, whatever the order. The int32 bias is added,
 * then MLAS's MlasRequantizeOutput: float32(acc) * scale[m], clamped to the type's range less the
 * output zero point, rounded half to even (the default MXCSR mode; rintf on the portable level), plus
 * the zero point. Output mode 2 stores float32(acc) * scale[m] instead (QGemm without y_scale).
 *
 * qbinary: QLinearAdd (MLAS qladd: fma(a, ra, fma(b, rb, fixed)) where MLAS runs its AVX2 kernel, else
 * (fixed + a * ra) + b * rb) and QLinearMul ((a - za) * (b - zb) in int32, times the ratio, plus zc),
 * rounded half to even and saturated; b is either elementwise or one value per span of a.
 *
 * qgap: QLinearGlobalAveragePool: the integer sum of each plane minus zx * size, requantized.
 *
 * quantize_f32 / dequantize_f32: per-tensor QuantizeLinear (x / scale, clamped, rounded half to even,
 * plus the zero point: MLAS's order) and DequantizeLinear ((x - zp) * scale in float32).
 *
 * Everything runs with the GIL released; a large convolution's GEMM (AVX2) is split over the pool in
 * blocks of weight rows, the rest runs on the calling thread. The column scratch is per thread and only
 * grows. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "qlinear.h"
#include "rnn_module.h" /* ext_isa_level */
#include "tl_scratch.h"

#if defined(__x86_64__) || defined(_M_X64)
#define QL_X86 1
#include <immintrin.h>
#endif

typedef struct {
    long n, c, h, w, g, mg, kh, kw, oh, ow, pt, pl, sh, sw, dh, dw;
    int zx, zy, xsigned, ymode; /* ymode: 0 uint8, 1 int8, 2 float32 */
} qc_dims;

static _Thread_local int16_t *tl_cols;
static _Thread_local size_t tl_cols_n;

static void tl_cols_free(void)
{
    free(tl_cols);
    tl_bytes(-(long long)(tl_cols_n * sizeof(int16_t)));
    tl_cols = NULL;
    tl_cols_n = 0;
}

static int16_t *cols_scratch(size_t n)
{
    if (n > tl_cols_n) {
        int16_t *p = (int16_t *)realloc(tl_cols, n * sizeof(int16_t));
        if (!p) return NULL;
        if (!tl_cols) tl_at_exit(tl_cols_free);
        tl_bytes((long long)((n - tl_cols_n) * sizeof(int16_t)));
        tl_cols = p;
        tl_cols_n = n;
    }
    return tl_cols;
}

/* the padded input extent im2col_i16 reads: rows [0, HP), columns [0, WP) of the image with its leading
 * pads in front */
static void padded_extent(const qc_dims *d, long *HP, long *WP)
{
    *HP = (d->oh - 1) * d->sh + (d->kh - 1) * d->dh + 1;
    *WP = (d->ow - 1) * d->sw + (d->kw - 1) * d->dw + 1;
}

/* columns of one image's group: cols[k * P16 + p] = x - zx (0 outside the image, past P and at k = K when
 * K is odd). The group's planes are first centered once into xp [cg, HP, WP] with zeros in the pads, so
 * each column row is a plain copy (unit stride, 16 columns at a time: the scratch has 16 more) or a
 * strided gather, with no bounds per row: on small
 * planes the per-row bounds cost more than the product (32 channels of 12x12, 3x3: ~3500 rows of 12) */
/* the group's planes centered (x - zx) into xp [cg, HP, WP], zeros in the pads */
static void center_planes(const uint8_t *xg, const qc_dims *d, long cg, int16_t *xp, long HP, long WP)
{
    const int zx = d->zx;
    memset(xp, 0, (size_t)(cg * HP * WP) * 2);
    const long nx = d->w < WP - d->pl ? d->w : WP - d->pl; /* input columns inside the extent */
    for (long ci = 0; ci < cg && nx > 0; ci++) {
        for (long iy = 0; iy < d->h && iy + d->pt < HP; iy++) {
            int16_t *dst = xp + (ci * HP + iy + d->pt) * WP + d->pl;
            if (d->xsigned) {
                const int8_t *row = (const int8_t *)xg + (ci * d->h + iy) * d->w;
                for (long ix = 0; ix < nx; ix++) dst[ix] = (int16_t)(row[ix] - zx);
            } else {
                const uint8_t *row = xg + (ci * d->h + iy) * d->w;
                for (long ix = 0; ix < nx; ix++) dst[ix] = (int16_t)(row[ix] - zx);
            }
        }
    }
}

#ifdef QL_X86
static void gather_s2_avx512(int16_t *dst, const int16_t *src, long n);
#endif

/* im2col_i16's wide build: stride-2 rows gathered 16 at a time (gather_s2_avx512) */
static int g_im2col_s2_wide;

static void im2col_i16(const uint8_t *xg, const qc_dims *d, long cg, int16_t *cols, long P16, int16_t *xp)
{
    long HP, WP;
    padded_extent(d, &HP, &WP);
    const long kk = d->kh * d->kw, K = cg * kk, P = d->oh * d->ow;
    center_planes(xg, d, cg, xp, HP, WP);
    for (long k = 0; k < K; k++) {
        const long ci = k / kk, r = k % kk, ky = r / d->kw, kx = r % d->kw;
        int16_t *dst = cols + k * P16;
        const int16_t *src = xp + (ci * HP + ky * d->dh) * WP + kx * d->dw;
        for (long oy = 0; oy < d->oh; oy++, dst += d->ow, src += d->sh * WP) {
            if (d->sw == 1) { /* 16 at a time: the overhang is rewritten by the next row (or the tail memsets) */
                for (long ox = 0; ox < d->ow; ox += 16) memcpy(dst + ox, src + ox, 32);
            } else {
#ifdef QL_X86
                if (d->sw == 2 && g_im2col_s2_wide) {
                    gather_s2_avx512(dst, src, d->ow);
                    continue;
                }
#endif
                for (long ox = 0; ox < d->ow; ox++) dst[ox] = src[ox * d->sw];
            }
        }
        memset(cols + k * P16 + P, 0, (size_t)(P16 - P) * 2);
    }
    if (K & 1) memset(cols + K * P16, 0, (size_t)P16 * 2);
}

static inline int clamp_round(float f, float lo, float hi, int zy)
{
    f = f > lo ? f : lo; /* NaN -> lo, as maxps(f, lo) */
    f = f < hi ? f : hi;
    return (int)rintf(f) + zy;
}

static void store_out(void *y, long idx, int ymode, int32_t acc, float scale, float lo, float hi, int zy)
{
    const float f = (float)acc * scale;
    if (ymode == 2) {
        ((float *)y)[idx] = f;
    } else if (ymode == 1) {
        ((int8_t *)y)[idx] = (int8_t)clamp_round(f, lo, hi, zy);
    } else {
        ((uint8_t *)y)[idx] = (uint8_t)clamp_round(f, lo, hi, zy);
    }
}

/* acc: P16 uint32 of scratch (uint32: wraps as the SIMD sums do; an int32 overflow is onnxruntime's too) */
static void gemm_portable(const int16_t *w, long Kp, const int16_t *cols, long P16, long P, long mg, const int32_t *bias,
                          const float *scales, void *y, long ybase, int ymode, float lo, float hi, int zy,
                          uint32_t *acc)
{
    for (long m = 0; m < mg; m++) {
        const int16_t *wr = w + m * Kp;
        for (long p = 0; p < P; p++) acc[p] = (uint32_t)bias[m];
        for (long k = 0; k < Kp; k++) {
            const int32_t wk = wr[k];
            const int16_t *c = cols + k * P16;
            for (long p = 0; p < P; p++) acc[p] += (uint32_t)((int32_t)c[p] * wk);
        }
        for (long p = 0; p < P; p++) store_out(y, ybase + m * P + p, ymode, (int32_t)acc[p], scales[m], lo, hi, zy);
    }
}

#ifdef QL_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static inline void store8_avx2(void *y, long idx, int ymode, __m256i acc, __m256 scale, __m256 lo, __m256 hi,
                               __m256i zy, long count)
{
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), scale);
    if (ymode == 2) {
        if (count == 8) {
            _mm256_storeu_ps((float *)y + idx, f);
        } else {
            float t[8];
            _mm256_storeu_ps(t, f);
            memcpy((float *)y + idx, t, (size_t)count * 4);
        }
        return;
    }
    f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
    const __m256i v = _mm256_add_epi32(_mm256_cvtps_epi32(f), zy);
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i p8 = ymode == 1 ? _mm_packs_epi16(p16, p16) : _mm_packus_epi16(p16, p16);
    uint8_t *dst = (uint8_t *)y + idx;
    if (count == 8) {
        _mm_storel_epi64((__m128i *)dst, p8);
    } else {
        uint8_t t[16];
        _mm_storeu_si128((__m128i *)t, p8);
        memcpy(dst, t, (size_t)count);
    }
}

#define QL_BCAST(ptr) _mm256_set1_epi32(*(const int32_t *)(ptr))

/* 4 weight rows x 16 pixels: rows k and k + 1 of the columns interleaved into pairs (unpacklo: pixels
 * 0-3 and 8-11, unpackhi: 4-7 and 12-15), each pair times a weight pair in int32 (vpmaddwd) */
static void gemm_avx2(const int16_t *w, long Kp, const int16_t *cols, long P16, long P, long mg, const int32_t *bias,
                      const float *scales, void *y, long ybase, int ymode, float lo_f, float hi_f, int zy_i)
{
    const __m256 lo = _mm256_set1_ps(lo_f), hi = _mm256_set1_ps(hi_f);
    const __m256i zy = _mm256_set1_epi32(zy_i);
    for (long m0 = 0; m0 < mg; m0 += 4) {
        const long rows = mg - m0 < 4 ? mg - m0 : 4;
        const int16_t *w0 = w + m0 * Kp, *w1 = w + (m0 + (rows > 1)) * Kp, *w2 = w + (m0 + (rows > 2 ? 2 : 0)) * Kp;
        const int16_t *w3 = w + (m0 + (rows > 3 ? 3 : 0)) * Kp;
        for (long p0 = 0; p0 < P16; p0 += 16) {
            __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
                    a31 = a00;
            const int16_t *c = cols + p0;
            for (long k = 0; k < Kp; k += 2, c += 2 * P16) {
                const __m256i r0 = _mm256_loadu_si256((const __m256i *)c);
                const __m256i r1 = _mm256_loadu_si256((const __m256i *)(c + P16));
                const __m256i lo16 = _mm256_unpacklo_epi16(r0, r1), hi16 = _mm256_unpackhi_epi16(r0, r1);
                const __m256i b0 = QL_BCAST(w0 + k), b1 = QL_BCAST(w1 + k);
                a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(lo16, b0));
                a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(hi16, b0));
                a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(lo16, b1));
                a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(hi16, b1));
                const __m256i b2 = QL_BCAST(w2 + k), b3 = QL_BCAST(w3 + k);
                a20 = _mm256_add_epi32(a20, _mm256_madd_epi16(lo16, b2));
                a21 = _mm256_add_epi32(a21, _mm256_madd_epi16(hi16, b2));
                a30 = _mm256_add_epi32(a30, _mm256_madd_epi16(lo16, b3));
                a31 = _mm256_add_epi32(a31, _mm256_madd_epi16(hi16, b3));
            }
            const __m256i acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
            for (long r = 0; r < rows; r++) {
                const long m = m0 + r;
                const __m256i b = _mm256_set1_epi32(bias[m]);
                const __m256 s = _mm256_set1_ps(scales[m]);
                const __m256i first = _mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x20);  /* pixels 0-7 */
                const __m256i second = _mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x31); /* pixels 8-15 */
                if (p0 < P)
                    store8_avx2(y, ybase + m * P + p0, ymode, _mm256_add_epi32(first, b), s, lo, hi, zy,
                                P - p0 < 8 ? P - p0 : 8);
                if (p0 + 8 < P)
                    store8_avx2(y, ybase + m * P + p0 + 8, ymode, _mm256_add_epi32(second, b), s, lo, hi, zy,
                                P - p0 - 8 < 8 ? P - p0 - 8 : 8);
            }
        }
    }
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")
/* The AVX-512 VNNI product, column row k read at xp + off[k]: the im2col columns (off[k] = k * P16, WP =
 * ow: every position valid) or, for stride-1 convolutions, no column matrix: the output is computed on
 * the padded width (wide position p = oy * WP + ox, ox < WP; the ox >= ow ones are computed and dropped),
 * where the column row of k = (ci, ky, kx) is the centered padded planes xp from off[k] = (ci * HP + ky *
 * dh) * WP + kx * dw on, a plain slice. Rows k and k + 1 interleaved into pairs in position order (one
 * permute of both), each pair times a weight pair added in int32 by one vpdpwssd (exact: centered values
 * are at most 255 in magnitude, no pair sum saturates), on 8 weight rows x 32 positions (16 sums in
 * registers, each weight pair broadcast once for 32 positions) with a 16-position tail; then gemm_avx2's
 * requantization on 16 positions at once (the same operations per pixel: the same bits), the valid
 * positions of a block being the next outputs in row-major order (compressed, then stored). The wide
 * path's xp holds zeros past the planes and P16w + 64 more (the dropped lanes read them). */
/* dst[0, n) = src[0], src[2], ...: 16 at a time from a masked load of 31 (nothing read past src[2n - 2]) */
static void gather_s2_avx512(int16_t *dst, const int16_t *src, long n)
{
    const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                          22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (long i = 0; i < n; i += 16, src += 32) {
        const long m = n - i < 16 ? n - i : 16, need = 2 * m - 1;
        const __m512i v = _mm512_maskz_loadu_epi16((__mmask32)(need >= 32 ? 0xFFFFFFFFu : (1u << need) - 1u), src);
        _mm256_mask_storeu_epi16(dst + i, (__mmask16)((1u << m) - 1u),
                                 _mm512_castsi512_si256(_mm512_permutexvar_epi16(even, v)));
    }
}

static inline __m512i ql_pair(const int16_t *r0, const int16_t *r1, __m512i pairs)
{
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r0)),
                                            _mm256_loadu_si256((const __m256i *)r1), 1);
    return _mm512_permutexvar_epi16(pairs, both);
}

static inline void ql_store16(void *y, long idx, int ymode, __m512i acc, int32_t bias, float scale, __m512 lo,
                              __m512 hi, __m512i zy, __mmask16 valid, int count)
{
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, _mm512_set1_epi32(bias))),
                                   _mm512_set1_ps(scale));
    const __mmask16 first = (__mmask16)((1u << count) - 1u);
    if (ymode == 2) {
        _mm512_mask_storeu_ps((float *)y + idx, first, _mm512_maskz_compress_ps(valid, f));
        return;
    }
    const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(f, lo), hi)), zy);
    _mm_mask_storeu_epi8((uint8_t *)y + idx, first, _mm512_cvtepi32_epi8(_mm512_maskz_compress_epi32(valid, v)));
}

static void gemm_avx512(const int16_t *w, long Kp, const int16_t *xp, const long *off, long P16w, long WP,
                                 long ow, long P, long mg, const int32_t *bias, const float *scales, void *y,
                                 long ybase, int ymode, float lo_f, float hi_f, int zy_i)
{
    const __m512 lo = _mm512_set1_ps(lo_f), hi = _mm512_set1_ps(hi_f);
    const __m512i zy = _mm512_set1_epi32(zy_i);
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const long Pw = P / ow * WP; /* wide positions: oh rows of WP */
    for (long m0 = 0; m0 < mg; m0 += 8) {
        const long rows = mg - m0 < 8 ? mg - m0 : 8;
        const int16_t *wr[8];
        for (long r = 0; r < 8; r++) wr[r] = w + (m0 + (r < rows ? r : 0)) * Kp;
        for (long p0 = 0; p0 < P16w;) {
            const int two = p0 + 32 <= P16w;
            __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            __m512i b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
            const int16_t *w0 = wr[0], *w1 = wr[1], *w2 = wr[2], *w3 = wr[3], *w4 = wr[4], *w5 = wr[5], *w6 = wr[6],
                          *w7 = wr[7];
#define QL_W(wp) _mm512_set1_epi32(*(const int32_t *)((wp) + k))
            if (two) {
                for (long k = 0; k < Kp; k += 2) {
                    const int16_t *r0 = xp + off[k] + p0, *r1 = xp + off[k + 1] + p0;
                    const __m512i x0 = ql_pair(r0, r1, pairs), x1 = ql_pair(r0 + 16, r1 + 16, pairs);
                    __m512i wv;
#define QL_DP2(a, b, wp) wv = QL_W(wp), a = _mm512_dpwssd_epi32(a, x0, wv), b = _mm512_dpwssd_epi32(b, x1, wv)
                    QL_DP2(a0, b0, w0); QL_DP2(a1, b1, w1); QL_DP2(a2, b2, w2); QL_DP2(a3, b3, w3);
                    QL_DP2(a4, b4, w4); QL_DP2(a5, b5, w5); QL_DP2(a6, b6, w6); QL_DP2(a7, b7, w7);
#undef QL_DP2
                }
            } else {
                for (long k = 0; k < Kp; k += 2) {
                    const __m512i x0 = ql_pair(xp + off[k] + p0, xp + off[k + 1] + p0, pairs);
#define QL_DP1(a, wp) a = _mm512_dpwssd_epi32(a, x0, QL_W(wp))
                    QL_DP1(a0, w0); QL_DP1(a1, w1); QL_DP1(a2, w2); QL_DP1(a3, w3);
                    QL_DP1(a4, w4); QL_DP1(a5, w5); QL_DP1(a6, w6); QL_DP1(a7, w7);
#undef QL_DP1
                }
            }
#undef QL_W
            const __m512i a[8] = {a0, a1, a2, a3, a4, a5, a6, a7}, b[8] = {b0, b1, b2, b3, b4, b5, b6, b7};
            for (int half = 0; half < 1 + two; half++) {
                const long q0 = p0 + 16 * half;
                if (q0 >= Pw) break;
                unsigned valid = 0;
                int count = 0;
                for (int i = 0; i < 16; i++) {
                    const long q = q0 + i;
                    if (q < Pw && q % WP < ow) valid |= 1u << i, count++;
                }
                if (!count) continue;
                const long start = q0 / WP * ow + (q0 % WP < ow ? q0 % WP : ow); /* outputs before q0 */
                for (long r = 0; r < rows; r++) {
                    const long m = m0 + r;
                    ql_store16(y, ybase + m * P + start, ymode, half ? b[r] : a[r], bias[m], scales[m], lo, hi, zy,
                               (__mmask16)valid, count);
                }
            }
            p0 += two ? 32 : 16;
        }
    }
}
#pragma GCC pop_options
#endif

#ifdef QL_X86
/* one image's group of gemm_avx2 (gemm_avx512 when wide) split over the pool by blocks of 4 (8) weight
 * rows (exact in any split) */
typedef struct {
    const int16_t *w, *cols;
    const int32_t *bias;
    const float *scales;
    void *y;
    long Kp, P16, P, mg, ybase, nblocks;
    float lo, hi;
    int ymode, zy, ntasks, wide;
    const long *off; /* wide: gemm_avx512's column rows (and, with WP > ow, cols the centered planes and P16
                      * the wide positions) */
    long WP, ow;
} qc_job;

static void qc_task(void *ctx, int t)
{
    const qc_job *j = (const qc_job *)ctx;
    const long rows = j->wide ? 8 : 4;
    const long m0 = rows * (j->nblocks * t / j->ntasks);
    long m1 = rows * (j->nblocks * (t + 1) / j->ntasks);
    if (m1 > j->mg) m1 = j->mg;
    if (m1 <= m0) return;
    if (j->wide)
        gemm_avx512(j->w + m0 * j->Kp, j->Kp, j->cols, j->off, j->P16, j->WP, j->ow, j->P, m1 - m0, j->bias + m0,
                    j->scales + m0, j->y, j->ybase + m0 * j->P, j->ymode, j->lo, j->hi, j->zy);
    else
        gemm_avx2(j->w + m0 * j->Kp, j->Kp, j->cols, j->P16, j->P, m1 - m0, j->bias + m0, j->scales + m0, j->y,
                  j->ybase + m0 * j->P, j->ymode, j->lo, j->hi, j->zy);
}
#endif

static int get_dims(PyObject *o, int64_t *out, Py_ssize_t n, const char *who)
{
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (b.len != n * 8) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "%s: dims must hold %zd int64", who, n);
        return -1;
    }
    memcpy(out, b.buf, (size_t)n * 8);
    PyBuffer_Release(&b);
    return 0;
}

static void release_all(Py_buffer *b, int n)
{
    for (int i = 0; i < n; i++) PyBuffer_Release(&b[i]);
}

static int get_buffers(PyObject *const *args, Py_buffer *b, int n, int writable_index)
{
    for (int i = 0; i < n; i++) {
        const int flags = PyBUF_C_CONTIGUOUS | (i == writable_index ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[i], &b[i], flags) < 0) {
            release_all(b, i);
            return -1;
        }
    }
    return 0;
}

static void type_range(int ymode, float zy, float *lo, float *hi)
{
    *lo = (ymode == 1 ? -128.0f : 0.0f) - zy;
    *hi = (ymode == 1 ? 127.0f : 255.0f) - zy;
}

/* qconv(x, w16 [M, Kp], bias int32 [M], scales float32 [M], y, dims int64[20]) */
PyObject *py_qconv(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "qconv takes 6 positional arguments");
        return NULL;
    }
    int64_t v[20];
    if (get_dims(args[5], v, 20, "qconv") < 0) return NULL;
    qc_dims d = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15],
                 (int)v[16], (int)v[17], (int)v[18], (int)v[19]};
    Py_buffer b[5];
    if (get_buffers(args, b, 5, 4) < 0) return NULL;
    const long cg = d.g > 0 ? d.c / d.g : 0, K = cg * d.kh * d.kw, Kp = (K + 1) & ~1L, P = d.oh * d.ow;
    const long P16 = (P + 15) & ~15L, M = d.g * d.mg;
    const Py_ssize_t ysize = d.ymode == 2 ? 4 : 1;
    if (d.g < 1 || d.c % d.g || P < 1 || b[0].len != (Py_ssize_t)(d.n * d.c * d.h * d.w) || b[1].len != 2 * M * Kp ||
        b[2].len != 4 * M || b[3].len != 4 * M || b[4].len != ysize * d.n * M * P) {
        release_all(b, 5);
        PyErr_SetString(PyExc_ValueError, "qconv: buffer sizes do not match dims");
        return NULL;
    }
    long HP, WP;
    padded_extent(&d, &HP, &WP);
    float lo, hi;
    type_range(d.ymode, (float)d.zy, &lo, &hi);
    const uint8_t *x = (const uint8_t *)b[0].buf;
    const int16_t *w = (const int16_t *)b[1].buf;
    const int32_t *bias = (const int32_t *)b[2].buf;
    const float *scales = (const float *)b[3].buf;
#ifdef QL_X86
    const int simd = ext_isa_level() >= 1, wide = ext_isa_level() >= 3;
    /* stride 1 at AVX-512, unless the padded width wastes more than a third: no column matrix */
    const long P16w = (d.oh * WP + 15) & ~15L, planes = cg * HP * WP;
    if (wide && d.sh == 1 && d.sw == 1 && 3 * d.oh * WP <= 4 * P) {
        int16_t *xp = cols_scratch((size_t)(planes + P16w + 64));
        long *off = (long *)malloc((size_t)Kp * sizeof(long));
        if (!xp || !off) {
            free(off);
            release_all(b, 5);
            return PyErr_NoMemory();
        }
        const long kk = d.kh * d.kw;
        for (long k = 0; k < Kp; k++) {
            const long kc = k < K ? k : 0; /* k = K (odd K): weight 0, any finite column */
            const long ci = kc / kk, r = kc % kk;
            off[k] = (ci * HP + r / d.kw * d.dh) * WP + r % d.kw * d.dw;
        }
        Py_BEGIN_ALLOW_THREADS
        memset(xp + planes, 0, (size_t)(P16w + 64) * 2);
        for (long img = 0; img < d.n; img++) {
            for (long gi = 0; gi < d.g; gi++) {
                center_planes(x + (img * d.c + gi * cg) * d.h * d.w, &d, cg, xp, HP, WP);
                const long m0 = gi * d.mg, ybase = (img * M + m0) * P;
                qc_job j = {w + m0 * Kp, xp, bias + m0, scales + m0, b[4].buf, Kp, P16w, P, d.mg, ybase,
                            (d.mg + 7) / 8, lo, hi, d.ymode, d.zy, 1, 1, off, WP, d.ow};
                if (d.mg * Kp * P16w >= 100000) j.ntasks = (int)(j.nblocks < 16 ? j.nblocks : 16);
                if (j.ntasks > 1)
                    nb_pool_run(qc_task, &j, j.ntasks);
                else
                    qc_task(&j, 0);
            }
        }
        Py_END_ALLOW_THREADS
        free(off);
        release_all(b, 5);
        Py_RETURN_NONE;
    }
#endif
    /* the columns, the portable sums, then the centered padded planes */
    int16_t *cols = cols_scratch((size_t)(Kp * P16 + 2 * P16 + cg * HP * WP + 16)); /* + im2col's overhang */
    long *off = NULL;
#ifdef QL_X86
    if (cols && wide && (off = (long *)malloc((size_t)Kp * sizeof(long))) != NULL)
        for (long k = 0; k < Kp; k++) off[k] = k * P16;
    if (!cols || (wide && !off)) {
#else
    if (!cols) {
#endif
        free(off);
        release_all(b, 5);
        return PyErr_NoMemory();
    }
#ifdef QL_X86
    g_im2col_s2_wide = wide; /* set under the GIL, as the dispatch level */
#endif
    Py_BEGIN_ALLOW_THREADS
    for (long img = 0; img < d.n; img++) {
        for (long gi = 0; gi < d.g; gi++) {
            im2col_i16(x + (img * d.c + gi * cg) * d.h * d.w, &d, cg, cols, P16, cols + Kp * P16 + 2 * P16);
            const long m0 = gi * d.mg, ybase = (img * M + m0) * P;
#ifdef QL_X86
            if (simd) {
                qc_job j = {w + m0 * Kp, cols, bias + m0, scales + m0, b[4].buf, Kp, P16, P, d.mg, ybase,
                            wide ? (d.mg + 7) / 8 : (d.mg + 3) / 4, lo, hi, d.ymode, d.zy, 1, wide, off, d.ow, d.ow};
                /* the pool for more than ~100k multiply-adds (below, waking a worker costs more) */
                if (d.mg * Kp * P16 >= 100000) j.ntasks = (int)(j.nblocks < 16 ? j.nblocks : 16);
                if (j.ntasks > 1)
                    nb_pool_run(qc_task, &j, j.ntasks);
                else
                    qc_task(&j, 0);
                continue;
            }
#endif
            gemm_portable(w + m0 * Kp, Kp, cols, P16, P, d.mg, bias + m0, scales + m0, b[4].buf, ybase, d.ymode, lo, hi,
                          d.zy, (uint32_t *)(cols + Kp * P16));
        }
    }
    Py_END_ALLOW_THREADS
    free(off);
    release_all(b, 5);
    Py_RETURN_NONE;
}

/* ---- QLinearAdd / QLinearMul ---- */

typedef struct {
    long n, span;
    int bmode, ysigned, op, fused;
    float p0, p1, p2;   /* add: ra, rb, fixed; mul: ratio, zc */
    int za, zb;         /* mul */
} qb_args;

static inline float qb_value(const qb_args *q, int a, int b)
{
    if (q->op == 0) {
        const float fa = (float)a, fb = (float)b;
        return q->fused ? fmaf(fa, q->p0, fmaf(fb, q->p1, q->p2)) : (q->p2 + fa * q->p0) + fb * q->p1;
    }
    const int32_t p = (int32_t)(a - q->za) * (int32_t)(b - q->zb);
    return (float)p * q->p0 + q->p1;
}

static void qbinary_portable(const qb_args *q, const uint8_t *a, const uint8_t *b, uint8_t *y, long i0, long i1)
{
    const float lo = q->ysigned ? -128.0f : 0.0f, hi = q->ysigned ? 127.0f : 255.0f;
    for (long i = i0; i < i1; i++) {
        const long j = q->bmode ? i / q->span : i;
        const int av = q->ysigned ? (int)(int8_t)a[i] : (int)a[i];
        const int bv = q->ysigned ? (int)(int8_t)b[j] : (int)b[j];
        const int r = clamp_round(qb_value(q, av, bv), lo, hi, 0);
        y[i] = (uint8_t)r; /* int8 as its two's complement byte */
    }
}

#ifdef QL_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static inline __m256i load8_i32(const uint8_t *p, int sgn)
{
    const __m128i v = _mm_loadl_epi64((const __m128i *)p);
    return sgn ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

static inline void store8_u8(uint8_t *dst, __m256i v, int sgn)
{
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)dst, sgn ? _mm_packs_epi16(p16, p16) : _mm_packus_epi16(p16, p16));
}

/* elements [i0, i0 + 8k) with b elementwise (bv NULL) or the one value bv */
static long qbinary_avx2_run(const qb_args *q, const uint8_t *a, const uint8_t *b, const int *bv, uint8_t *y,
                             long i0, long i1)
{
    const int sgn = q->ysigned;
    const __m256 lo = _mm256_set1_ps(sgn ? -128.0f : 0.0f), hi = _mm256_set1_ps(sgn ? 127.0f : 255.0f);
    const __m256 p0 = _mm256_set1_ps(q->p0), p1 = _mm256_set1_ps(q->p1), p2 = _mm256_set1_ps(q->p2);
    const __m256i za = _mm256_set1_epi32(q->za), zb = _mm256_set1_epi32(q->zb);
    const __m256i bb = _mm256_set1_epi32(bv ? *bv : 0);
    long i = i0;
    for (; i + 8 <= i1; i += 8) {
        const __m256i ai = load8_i32(a + i, sgn), bi = bv ? bb : load8_i32(b + i, sgn);
        __m256 f;
        if (q->op == 0) {
            const __m256 fa = _mm256_cvtepi32_ps(ai), fb = _mm256_cvtepi32_ps(bi);
            f = q->fused ? _mm256_fmadd_ps(fa, p0, _mm256_fmadd_ps(fb, p1, p2))
                         : _mm256_add_ps(_mm256_add_ps(p2, _mm256_mul_ps(fa, p0)), _mm256_mul_ps(fb, p1));
        } else {
            const __m256i pr = _mm256_mullo_epi32(_mm256_sub_epi32(ai, za), _mm256_sub_epi32(bi, zb));
            f = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(pr), p0), p1);
        }
        f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
        store8_u8(y + i, _mm256_cvtps_epi32(f), sgn);
    }
    return i;
}

static void qbinary_avx2(const qb_args *q, const uint8_t *a, const uint8_t *b, uint8_t *y)
{
    if (!q->bmode) {
        const long i = qbinary_avx2_run(q, a, b, NULL, y, 0, q->n);
        qbinary_portable(q, a, b, y, i, q->n);
        return;
    }
    for (long o = 0; o * q->span < q->n; o++) {
        const long i0 = o * q->span, i1 = i0 + q->span;
        const int bv = q->ysigned ? (int)(int8_t)b[o] : (int)b[o];
        const long i = qbinary_avx2_run(q, a, b, &bv, y, i0, i1);
        qbinary_portable(q, a, b, y, i, i1);
    }
}
#pragma GCC pop_options
#endif

/* qbinary(a, b, y, dims int64[6] (n, span, bmode, signed, op, fused), params float64[5]) */
PyObject *py_qbinary(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "qbinary takes 5 positional arguments");
        return NULL;
    }
    int64_t v[6];
    if (get_dims(args[3], v, 6, "qbinary") < 0) return NULL;
    Py_buffer pb;
    if (PyObject_GetBuffer(args[4], &pb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (pb.len != 5 * 8) {
        PyBuffer_Release(&pb);
        PyErr_SetString(PyExc_ValueError, "qbinary: params must hold 5 float64");
        return NULL;
    }
    const double *p = (const double *)pb.buf;
    qb_args q = {v[0], v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5], (float)p[0], (float)p[1], (float)p[2],
                 (int)p[3], (int)p[4]};
    PyBuffer_Release(&pb);
    Py_buffer b[3];
    if (get_buffers(args, b, 3, 2) < 0) return NULL;
    if (q.span < 1 || b[0].len != q.n || b[2].len != q.n || b[1].len != (q.bmode ? q.n / q.span : q.n) ||
        (q.bmode && q.n % q.span)) {
        release_all(b, 3);
        PyErr_SetString(PyExc_ValueError, "qbinary: buffer sizes do not match dims");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
#ifdef QL_X86
    if (ext_isa_level() >= 1)
        qbinary_avx2(&q, b[0].buf, b[1].buf, b[2].buf);
    else
#endif
        qbinary_portable(&q, b[0].buf, b[1].buf, b[2].buf, 0, q.n);
    Py_END_ALLOW_THREADS
    release_all(b, 3);
    Py_RETURN_NONE;
}

/* qgap(x, y, dims int64[5] (planes, size, zx, zy, signed), scale) */
PyObject *py_qgap(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "qgap takes 4 positional arguments");
        return NULL;
    }
    int64_t v[5];
    if (get_dims(args[2], v, 5, "qgap") < 0) return NULL;
    const float scale = (float)PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer b[2];
    if (get_buffers(args, b, 2, 1) < 0) return NULL;
    const long planes = v[0], size = v[1];
    const int zx = (int)v[2], zy = (int)v[3], sgn = (int)v[4];
    if (b[0].len != planes * size || b[1].len != planes) {
        release_all(b, 2);
        PyErr_SetString(PyExc_ValueError, "qgap: buffer sizes do not match dims");
        return NULL;
    }
    float lo, hi;
    type_range(sgn, (float)zy, &lo, &hi);
    const uint8_t *x = b[0].buf;
    uint8_t *y = b[1].buf;
    Py_BEGIN_ALLOW_THREADS
    for (long i = 0; i < planes; i++) {
        const uint8_t *row = x + i * size;
        int64_t s = 0;
        if (sgn) {
            for (long j = 0; j < size; j++) s += (int8_t)row[j];
        } else {
            for (long j = 0; j < size; j++) s += row[j];
        }
        const int32_t acc = (int32_t)(uint32_t)(s - (int64_t)zx * size);
        y[i] = (uint8_t)clamp_round((float)acc * scale, lo, hi, zy);
    }
    Py_END_ALLOW_THREADS
    release_all(b, 2);
    Py_RETURN_NONE;
}

static void quantize_portable(const float *x, uint8_t *y, long i0, long n, float scale, int zp, int sgn)
{
    float lo, hi;
    type_range(sgn, (float)zp, &lo, &hi);
    for (long i = i0; i < n; i++) y[i] = (uint8_t)clamp_round(x[i] / scale, lo, hi, zp);
}

#ifdef QL_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static long quantize_avx2(const float *x, uint8_t *y, long n, float scale, int zp, int sgn)
{
    float lo_f, hi_f;
    type_range(sgn, (float)zp, &lo_f, &hi_f);
    const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps(lo_f), hi = _mm256_set1_ps(hi_f);
    const __m256i z = _mm256_set1_epi32(zp);
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_div_ps(_mm256_loadu_ps(x + i), s);
        f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
        store8_u8(y + i, _mm256_add_epi32(_mm256_cvtps_epi32(f), z), sgn);
    }
    return i;
}

static long dequantize_avx2(const uint8_t *x, float *y, long n, float scale, int zp, int sgn)
{
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps((float)zp);
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 f = _mm256_cvtepi32_ps(load8_i32(x + i, sgn));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_sub_ps(f, z), s));
    }
    return i;
}
#pragma GCC pop_options
#endif

/* quantize_f32(x float32, y, zp, signed, scale) and dequantize_f32(x, y float32, zp, signed, scale) */
static PyObject *qdq_call(PyObject *const *args, Py_ssize_t nargs, int quant)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "quantize_f32/dequantize_f32 take 5 positional arguments");
        return NULL;
    }
    const int zp = (int)PyLong_AsLong(args[2]), sgn = (int)PyLong_AsLong(args[3]);
    const float scale = (float)PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer b[2];
    if (get_buffers(args, b, 2, 1) < 0) return NULL;
    const long n = (long)(quant ? b[1].len : b[0].len);
    if ((quant ? b[0].len : b[1].len) != 4 * (Py_ssize_t)n) {
        release_all(b, 2);
        PyErr_SetString(PyExc_ValueError, "quantize_f32/dequantize_f32: x and y sizes differ");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    long i = 0;
    if (quant) {
#ifdef QL_X86
        if (ext_isa_level() >= 1) i = quantize_avx2(b[0].buf, b[1].buf, n, scale, zp, sgn);
#endif
        quantize_portable(b[0].buf, b[1].buf, i, n, scale, zp, sgn);
    } else {
        const uint8_t *x = b[0].buf;
        float *y = b[1].buf;
#ifdef QL_X86
        if (ext_isa_level() >= 1) i = dequantize_avx2(x, y, n, scale, zp, sgn);
#endif
        for (; i < n; i++) y[i] = ((float)(sgn ? (int)(int8_t)x[i] : (int)x[i]) - (float)zp) * scale;
    }
    Py_END_ALLOW_THREADS
    release_all(b, 2);
    Py_RETURN_NONE;
}

PyObject *py_quantize_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return qdq_call(args, nargs, 1);
}

PyObject *py_dequantize_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return qdq_call(args, nargs, 0);
}

/* qlookup(x 8-bit, table uint8[256], y 8-bit): y[i] = table[x[i]] (a DequantizeLinear -> float op ->
 * QuantizeLinear chain tabulated once, kernels/qlinear_packed.py) */
#ifdef QL_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vbmi")
/* y[i] = t[x[i]], 64 bytes at a time: two 128-byte halves of the table by vpermi2b, chosen by the index's
 * top bit (a lookup: the same bytes as the scalar loop) */
static void qlookup_vbmi(const uint8_t *x, const uint8_t *t, uint8_t *y, Py_ssize_t n)
{
    const __m512i t0 = _mm512_loadu_si512((const void *)t), t1 = _mm512_loadu_si512((const void *)(t + 64));
    const __m512i t2 = _mm512_loadu_si512((const void *)(t + 128)), t3 = _mm512_loadu_si512((const void *)(t + 192));
    for (Py_ssize_t i = 0; i < n; i += 64) {
        const Py_ssize_t left = n - i;
        const __mmask64 k = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
        const __m512i idx = _mm512_maskz_loadu_epi8(k, x + i);
        const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1), hi = _mm512_permutex2var_epi8(t2, idx, t3);
        _mm512_mask_storeu_epi8(y + i, k, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi));
    }
}
#pragma GCC pop_options
#endif

PyObject *py_qlookup(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "qlookup takes 3 positional arguments");
        return NULL;
    }
    Py_buffer b[3];
    if (get_buffers(args, b, 3, 2) < 0) return NULL;
    if (b[1].len != 256 || b[0].len != b[2].len) {
        release_all(b, 3);
        PyErr_SetString(PyExc_ValueError, "qlookup: table must hold 256 bytes and y as many as x");
        return NULL;
    }
    const uint8_t *x = b[0].buf, *t = b[1].buf;
    uint8_t *y = b[2].buf;
    const Py_ssize_t n = b[0].len;
#ifdef QL_X86
    /* AVX-512 VBMI where the dispatch level is AVX-512 and the CPU has it (Zen 4 on, Ice Lake on) */
    const int vbmi = ext_isa_level() >= 3 && __builtin_cpu_supports("avx512vbmi");
#endif
    Py_BEGIN_ALLOW_THREADS
#ifdef QL_X86
    if (vbmi)
        qlookup_vbmi(x, t, y, n);
    else
#endif
        for (Py_ssize_t i = 0; i < n; i++) y[i] = t[x[i]];
    Py_END_ALLOW_THREADS
    release_all(b, 3);
    Py_RETURN_NONE;
}
