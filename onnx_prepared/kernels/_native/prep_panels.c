/* The panel16 transpose of a MatMulNBits prepack (and nb_pack_panels: a panel range packed from the
 * source arrays, for matmul_q4_source): rows of 16 columns' words interleaved so that a panel
 * reads one 64-byte line per k, each word's nibbles reordered for layout v2 (nbits.h: byte i = k values i
 * and i + 4 of the chunk; the source has k value j in nibble j). numpy does it as a strided copy whose inner loop is 16 elements long
 * (about 17x slower than a plain copy of the same bytes); here it is 16 x 16 blocks, one panel at a
 * time, with the GIL released (a prepack runs beside the first inference). */
#include "prep_panels.h"

#include "nbits.h"
#include "rnn_module.h" /* ext_isa_level */

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PANEL_AVX512 1
#endif

/* 4 nibbles -> the low nibbles of 4 bytes */
static inline uint32_t spread4(uint32_t x)
{
    x = (x | (x << 8)) & 0x00FF00FFu;
    return (x | (x << 4)) & 0x0F0F0F0Fu;
}

static inline uint32_t interleave(uint32_t w)
{
    return spread4(w & 0xFFFFu) | (spread4(w >> 16) << 4);
}

static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4); /* the source may sit at any byte offset of its buffer */
    return v;
}

/* One panel: columns 0..ncols-1 of src (rows of kc words, row stride kc words) -> dst [kc][16], the
 * columns from ncols on zero (the last panel of an N that is not a multiple of 16). */
static void panel16_one(const uint8_t *restrict s, uint32_t *restrict d, size_t kc, int ncols)
{
    size_t k0 = 0;
    for (; k0 + 16 <= kc; k0 += 16) {
        uint32_t blk[16][16];
        /* the nibble interleave on contiguous rows (a vector loop), then the 16 x 16 transpose:
         * interleaving during the transpose (strided words) made it scalar, ~3x slower */
        for (int j = 0; j < ncols; j++) {
            const uint8_t *row = s + ((size_t)j * kc + k0) * 4;
            for (int k = 0; k < 16; k++) blk[j][k] = interleave(load_u32(row + 4 * k));
        }
        for (int j = ncols; j < 16; j++)
            for (int k = 0; k < 16; k++) blk[j][k] = 0;
        for (int k = 0; k < 16; k++)
            for (int j = 0; j < 16; j++) d[(k0 + k) * 16 + j] = blk[j][k];
    }
    for (size_t k = k0; k < kc; k++)
        for (int j = 0; j < 16; j++) d[k * 16 + j] = j < ncols ? interleave(load_u32(s + ((size_t)j * kc + k) * 4)) : 0;
}

/* [N][kb] floats -> [p1 - p0][kb][16] of panels p0..p1-1, the columns past N zero */
static void panel16_f32(const float *restrict s, float *restrict d, int N, int kb, int p0, int p1)
{
    for (int p = p0; p < p1; p++) {
        const int n0 = 16 * p, ncols = N - n0 < 16 ? N - n0 : 16;
        float *dp = d + (size_t)(p - p0) * kb * 16;
        for (int b = 0; b < kb; b++) {
            for (int j = 0; j < ncols; j++) dp[b * 16 + j] = s[(size_t)(n0 + j) * kb + b];
            for (int j = ncols; j < 16; j++) dp[b * 16 + j] = 0.0f;
        }
    }
}

#ifdef PANEL_AVX512
/* NOTE (AVX-512 panels): the scalar 16 x 16 transpose above stores one word per instruction; the cold first
 * run packs every 4-bit weight it computes from (matmul_q4_source), and at 16 tokens that packing took
 * nearly as much CPU as the multiplications (perf, cold medium tiny-llm, Zen 4: 31 ms against 40). Here
 * each block is 16 row loads, the nibble interleave on whole registers, the transpose in registers
 * (unpack 32/64-bit, then two 128-bit lane shuffles) and 16 row stores: panel16 of 1024 x 5632, warm,
 * 0.34 -> 0.15 ms; matmul_q4_source at M = 16 on one thread over one layer's four shapes, weights from
 * memory, 3187 -> 2708 us. The bytes written are the scalar path's (pure data movement: tests compare
 * pack_q4 with numpy's, and matmul_q4_source with matmul_q4, bit for bit). */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

static inline __m512i interleave16(__m512i w)
{
    /* per word: byte b of lo = nibble 2b, of hi = nibble 2b + 1; x | x >> 12 puts nibbles (0, 4) and (2, 6)
     * of lo (1, 5 and 3, 7 of hi) in bytes 0 and 1; the result's bytes are nibble pairs (i, i + 4) */
    const __m512i m = _mm512_set1_epi32(0x0F0F0F0F), b0 = _mm512_set1_epi32(0xFF), b1 = _mm512_set1_epi32(0xFF00);
    const __m512i lo = _mm512_and_si512(w, m), hi = _mm512_and_si512(_mm512_srli_epi32(w, 4), m);
    const __m512i P = _mm512_or_si512(lo, _mm512_srli_epi32(lo, 12)), Q = _mm512_or_si512(hi, _mm512_srli_epi32(hi, 12));
    __m512i out = _mm512_and_si512(P, b0);
    out = _mm512_or_si512(out, _mm512_slli_epi32(_mm512_and_si512(Q, b0), 8));
    out = _mm512_or_si512(out, _mm512_slli_epi32(_mm512_and_si512(P, b1), 8));
    return _mm512_or_si512(out, _mm512_slli_epi32(_mm512_and_si512(Q, b1), 16));
}

/* r[j] = row j (16 words) -> d + k * 16: word j of row k is r[j][k] */
static inline void transpose16_store(__m512i r[16], uint32_t *restrict d)
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        const __m512 a = _mm512_castsi512_ps(r[2 * i]), b = _mm512_castsi512_ps(r[2 * i + 1]);
        t[2 * i] = _mm512_unpacklo_ps(a, b);
        t[2 * i + 1] = _mm512_unpackhi_ps(a, b);
    }
    for (int i = 0; i < 4; i++) {
        const int q = 4 * i;
        u[q] = _mm512_shuffle_ps(t[q], t[q + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[q + 1] = _mm512_shuffle_ps(t[q], t[q + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[q + 2] = _mm512_shuffle_ps(t[q + 1], t[q + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[q + 3] = _mm512_shuffle_ps(t[q + 1], t[q + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            t[8 * h + i] = _mm512_shuffle_f32x4(u[8 * h + i], u[8 * h + 4 + i], 0x88);
            t[8 * h + 4 + i] = _mm512_shuffle_f32x4(u[8 * h + i], u[8 * h + 4 + i], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        _mm512_storeu_ps((float *)(d + (size_t)i * 16), _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88));
        _mm512_storeu_ps((float *)(d + (size_t)(8 + i) * 16), _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd));
    }
}

/* panel16_one with its full 16 x 16 blocks in registers (the tail of k as before) */
static void panel16_one_avx512(const uint8_t *restrict s, uint32_t *restrict d, size_t kc, int ncols)
{
    size_t k0 = 0;
    __m512i r[16];
    for (; k0 + 16 <= kc; k0 += 16) {
        /* the next panel's block (its 16 columns follow these): the source comes from memory on a cold run,
         * and the hardware prefetchers do not run 16 streams 512+ bytes apart far enough ahead (thread CPU
         * of matmul_q4_source, one layer and the LM head, weights from memory: M = 16 13566 -> 12330 us,
         * M = 128 60191 -> 57573). Past the last panel it touches nothing: a prefetch never faults. */
        for (int j = 0; j < 16; j++) _mm_prefetch((const char *)(s + ((size_t)(16 + j) * kc + k0) * 4), _MM_HINT_T0);
        for (int j = 0; j < 16; j++)
            r[j] = j < ncols ? interleave16(_mm512_loadu_si512((const void *)(s + ((size_t)j * kc + k0) * 4)))
                             : _mm512_setzero_si512();
        transpose16_store(r, d + k0 * 16);
    }
    for (size_t k = k0; k < kc; k++)
        for (int j = 0; j < 16; j++) d[k * 16 + j] = j < ncols ? interleave(load_u32(s + ((size_t)j * kc + k) * 4)) : 0;
}

/* panel16_f32 by 16 x 16 blocks in registers (the tail of kb as before) */
static void panel16_f32_avx512(const float *restrict s, float *restrict d, int N, int kb, int p0, int p1)
{
    __m512i r[16];
    for (int p = p0; p < p1; p++) {
        const int n0 = 16 * p, ncols = N - n0 < 16 ? N - n0 : 16;
        float *dp = d + (size_t)(p - p0) * kb * 16;
        int b0 = 0;
        for (; b0 + 16 <= kb; b0 += 16) {
            for (int j = 0; j < 16; j++)
                r[j] = j < ncols ? _mm512_loadu_si512((const void *)(s + (size_t)(n0 + j) * kb + b0)) : _mm512_setzero_si512();
            transpose16_store(r, (uint32_t *)(dp + (size_t)b0 * 16));
        }
        for (int b = b0; b < kb; b++) {
            for (int j = 0; j < ncols; j++) dp[b * 16 + j] = s[(size_t)(n0 + j) * kb + b];
            for (int j = ncols; j < 16; j++) dp[b * 16 + j] = 0.0f;
        }
    }
}
#pragma GCC pop_options
#endif

/* the AVX-512 panels where the extension dispatches at that level (ONNX_PREPARED_ISA may force a lower one) */
static int panels_avx512(void)
{
#ifdef PANEL_AVX512
    return ext_isa_level() >= 3;
#else
    return 0;
#endif
}

void nb_pack_panels(const nb_src *s, int p0, int p1, uint8_t *qw, float *sc, void *zp)
{
    const size_t kc = (size_t)s->kc;
#ifdef PANEL_AVX512
    if (panels_avx512()) {
        for (int p = p0; p < p1; p++) {
            const int n0 = 16 * p, ncols = s->N - n0 < 16 ? s->N - n0 : 16;
            panel16_one_avx512(s->b + (size_t)n0 * kc * 4, (uint32_t *)(qw + (size_t)(p - p0) * kc * 64), kc, ncols);
        }
        panel16_f32_avx512(s->sc, sc, s->N, s->kb, p0, p1);
        if (s->zp_kind == NB_ZP_F32) panel16_f32_avx512(s->zpf, (float *)zp, s->N, s->kb, p0, p1);
    } else
#endif
    {
        for (int p = p0; p < p1; p++) {
            const int n0 = 16 * p, ncols = s->N - n0 < 16 ? s->N - n0 : 16;
            panel16_one(s->b + (size_t)n0 * kc * 4, (uint32_t *)(qw + (size_t)(p - p0) * kc * 64), kc, ncols);
        }
        panel16_f32(s->sc, sc, s->N, s->kb, p0, p1);
        if (s->zp_kind == NB_ZP_F32) panel16_f32(s->zpf, (float *)zp, s->N, s->kb, p0, p1);
    }
    if (s->zp_kind == NB_ZP_U4) { /* source rows of ceil(kb / 2) bytes, block b in nibble b & 1 of byte b / 2 */
        const int kb = s->kb, row = (kb + 1) / 2;
        uint8_t *z = (uint8_t *)zp;
        for (int p = p0; p < p1; p++)
            for (int b = 0; b < kb; b++)
                for (int i = 0; i < 8; i++) {
                    uint8_t v = 0;
                    for (int h = 0; h < 2; h++) {
                        const int n = 16 * p + 2 * i + h;
                        if (n < s->N) v |= (uint8_t)(((s->zpn[(size_t)n * row + b / 2] >> (4 * (b & 1))) & 15) << (4 * h));
                    }
                    z[((size_t)(p - p0) * kb + b) * 8 + i] = v;
                }
    }
}

static void panel16(const uint32_t *restrict src, uint32_t *restrict dst, size_t P, size_t kc)
{
#ifdef PANEL_AVX512
    if (panels_avx512()) {
        for (size_t p = 0; p < P; p++) panel16_one_avx512((const uint8_t *)(src + p * 16 * kc), dst + p * kc * 16, kc, 16);
        return;
    }
#endif
    for (size_t p = 0; p < P; p++) panel16_one((const uint8_t *)(src + p * 16 * kc), dst + p * kc * 16, kc, 16);
}

PyObject *py_panel16_u32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "panel16_u32(src, dst, P, kc)");
        return NULL;
    }
    const Py_ssize_t P = PyLong_AsSsize_t(args[2]), kc = PyLong_AsSsize_t(args[3]);
    if ((P == -1 || kc == -1) && PyErr_Occurred()) return NULL;
    Py_buffer bs, bd;
    if (PyObject_GetBuffer(args[0], &bs, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &bd, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&bs);
        return NULL;
    }
    const size_t need = (size_t)P * 16 * (size_t)kc * 4;
    if (P < 0 || kc < 0 || (size_t)bs.len != need || (size_t)bd.len != need) {
        PyErr_SetString(PyExc_ValueError, "panel16_u32: src and dst must be P * 16 * kc uint32 words each");
        PyBuffer_Release(&bd);
        PyBuffer_Release(&bs);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    panel16((const uint32_t *)bs.buf, (uint32_t *)bd.buf, (size_t)P, (size_t)kc);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bd);
    PyBuffer_Release(&bs);
    Py_RETURN_NONE;
}
