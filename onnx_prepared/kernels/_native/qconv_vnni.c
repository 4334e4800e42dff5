/* QLinearConv at AVX-512 VNNI on 8-bit operands (qlinear_packed.py picks it for one-group 1-D/2-D convs
 * whose centered weights fit int8): vpdpbusd multiplies four uint8 input bytes by four int8 weights and
 * adds the four products to an int32 lane, twice the multiply-adds per instruction of qconv's int16
 * vpdpwssd and with no centered copy of the input.
 *
 * The images go once into a padded copy xp in blocks of 4 channels, each padded plane split into its
 * sw column phases: xp[img][C4/4][HP][sw][WPs][4] uint8 (int8 inputs moved by +128, as their zero point;
 * the padding and the channels past C hold the zero point), so that at any tap the 4 channels of 16
 * consecutive outputs of a row are 64 contiguous bytes. The weights are packed once (qlinear_packed.py)
 * as blocks of 8 output channels [ceil(M/8)][KQ][8][4] int8, k-quad q = cq * KH * KW + ky * KW + kx, byte
 * i the channel 4 cq + i (zero past C and M). A tile is 8 output channels x 3 segments of up to 16
 * outputs of one row (24 accumulators): each k-quad 3 loads and 8 broadcasts for 24 vpdpbusd.
 *
 * The sum is sum(x * w) - zx * sum(w) + bias (badj = bias - zx * sum(w), folded at packing; the
 * padding's zx cancels), in wrapping int32 as qconv's sums: the same integer modulo 2^32 whatever the
 * order; the requantization is qconv's (float32(acc + bias) * scale, clamped, rounded half to even,
 * + zy) on 16 outputs of a row at once, stored in place: the same bits as qconv at every level. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "qlinear.h"
#include "rnn_module.h" /* ext_isa_level */
#include "tl_scratch.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

enum { QV_R = 8, QV_NS = 3 };

typedef struct {
    const uint8_t *xp; /* [n][C4/4][HP][sw][WPs][4] */
    const int8_t *w;   /* [ceil(M/8)][KQ][8][4] */
    const int32_t *badj;
    const float *scales;
    void *y;
    const long *tap; /* per tap (ky, kx): its offset in int32 units inside a channel block */
    long n, M, MB, CQ, KK, KQ, HP, WPs, OH, OW, sh, sw, cqstride, nseg, seg_per_task, ntask_seg;
    int zy, ymode;
    float lo, hi;
} qv_job;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")

#define AI static inline __attribute__((always_inline))

/* segment s of an image: output row s / per_row, columns from 16 * (s % per_row) */
AI void qv_segment(const qv_job *j, long s, long *oy, long *ox0, long *cnt)
{
    const long per_row = (j->OW + 15) / 16;
    *oy = s / per_row;
    *ox0 = 16 * (s % per_row);
    *cnt = j->OW - *ox0 < 16 ? j->OW - *ox0 : 16;
}

AI void qv_tile(const qv_job *j, const int32_t *x0, const int32_t *x1, const int32_t *x2, const int8_t *wb,
                __m512i *acc, const int NSEG)
{
    __m512i a[QV_R][QV_NS];
    for (int r = 0; r < QV_R; r++)
        for (int s = 0; s < NSEG; s++) a[r][s] = _mm512_setzero_si512();
    const int32_t *wq = (const int32_t *)wb;
    for (long cq = 0; cq < j->CQ; cq++) {
        const long co = cq * j->cqstride;
        for (long t = 0; t < j->KK; t++, wq += QV_R) {
            const long o = co + j->tap[t];
            const __m512i v0 = _mm512_loadu_si512((const void *)(x0 + o));
            const __m512i v1 = NSEG > 1 ? _mm512_loadu_si512((const void *)(x1 + o)) : v0;
            const __m512i v2 = NSEG > 2 ? _mm512_loadu_si512((const void *)(x2 + o)) : v0;
#pragma GCC unroll 8
            for (int r = 0; r < QV_R; r++) {
                const __m512i wv = _mm512_set1_epi32(wq[r]);
                a[r][0] = _mm512_dpbusd_epi32(a[r][0], v0, wv);
                if (NSEG > 1) a[r][1] = _mm512_dpbusd_epi32(a[r][1], v1, wv);
                if (NSEG > 2) a[r][2] = _mm512_dpbusd_epi32(a[r][2], v2, wv);
            }
        }
    }
    for (int r = 0; r < QV_R; r++)
        for (int s = 0; s < NSEG; s++) acc[r * QV_NS + s] = a[r][s];
}

/* 16 outputs of row m: float32(acc + badj) * scale, then qconv's clamp and rounding, cnt of them stored */
AI void qv_store(const qv_job *j, __m512i acc, long m, long idx, long cnt)
{
    const __mmask16 k = (__mmask16)((1u << cnt) - 1u);
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, _mm512_set1_epi32(j->badj[m]))),
                                   _mm512_set1_ps(j->scales[m]));
    if (j->ymode == 2) {
        _mm512_mask_storeu_ps((float *)j->y + idx, k, f);
        return;
    }
    const __m512i v = _mm512_add_epi32(
        _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(j->lo)), _mm512_set1_ps(j->hi))),
        _mm512_set1_epi32(j->zy));
    _mm_mask_storeu_epi8((uint8_t *)j->y + idx, k, _mm512_cvtepi32_epi8(v));
}

/* task: one image, a block of 8 output channels, a run of segments (3 per tile) */
static void qv_task(void *ctx, int t)
{
    const qv_job *j = (const qv_job *)ctx;
    const long sb = t % j->ntask_seg, r = t / j->ntask_seg, mb = r % j->MB, img = r / j->MB;
    const long s0 = sb * j->seg_per_task, s1 = s0 + j->seg_per_task < j->nseg ? s0 + j->seg_per_task : j->nseg;
    const long m0 = mb * QV_R, rows = j->M - m0 < QV_R ? j->M - m0 : QV_R, PO = j->OH * j->OW;
    const int8_t *wb = j->w + mb * j->KQ * QV_R * 4;
    const int32_t *xi = (const int32_t *)j->xp + (size_t)img * j->CQ * j->cqstride;
    __m512i acc[QV_R * QV_NS];
    for (long s = s0; s < s1; s += QV_NS) {
        const int ns = (int)(s1 - s < QV_NS ? s1 - s : QV_NS);
        const int32_t *xs[QV_NS];
        long idx[QV_NS], cnt[QV_NS];
        for (int q = 0; q < QV_NS; q++) {
            long oy, ox0, c;
            qv_segment(j, s + (q < ns ? q : 0), &oy, &ox0, &c);
            xs[q] = xi + (oy * j->sh * j->sw) * j->WPs + ox0; /* row oy * sh, phase 0, column ox0 */
            idx[q] = oy * j->OW + ox0;
            cnt[q] = c;
        }
        if (ns == 3)
            qv_tile(j, xs[0], xs[1], xs[2], wb, acc, 3);
        else if (ns == 2)
            qv_tile(j, xs[0], xs[1], xs[0], wb, acc, 2);
        else
            qv_tile(j, xs[0], xs[0], xs[0], wb, acc, 1);
        const long ybase = (img * j->M + m0) * PO;
        for (long rr = 0; rr < rows; rr++)
            for (int q = 0; q < ns; q++) qv_store(j, acc[rr * QV_NS + q], m0 + rr, ybase + rr * PO + idx[q], cnt[q]);
    }
}

/* the images in 4-channel blocks of padded, phase-split planes (uint8; int8 moved by +128), the zero point
 * around: 16 pixels of 4 channel rows interleaved at a time (masked loads), stored as 16 int32 at unit
 * stride or compressed into their two column phases at stride 2; wider strides pixel by pixel */
static void qv_pack_input(const uint8_t *x, uint8_t *xp, long n, long C, long H, long W, long CQ, long HP, long sw,
                          long WPs, long pt, long pl, int zx_u8, int xsigned)
{
    const size_t plane = (size_t)HP * sw * WPs * 4; /* one channel block */
    memset(xp, zx_u8, (size_t)n * CQ * plane);
    const uint8_t flip = xsigned ? 0x80 : 0;
    const long WP = sw * WPs, nx = W < WP - pl ? W : WP - pl;
    const __m128i fl = _mm_set1_epi8((char)flip);
    for (long img = 0; img < n; img++)
        for (long cq = 0; cq < CQ; cq++) {
            uint8_t *blk = xp + ((size_t)img * CQ + cq) * plane;
            const long nc = C - 4 * cq < 4 ? C - 4 * cq : 4;
            for (long iy = 0; iy < H && iy + pt < HP; iy++) {
                const uint8_t *src[4];
                for (long i = 0; i < 4; i++) src[i] = x + ((img * C + 4 * cq + (i < nc ? i : 0)) * H + iy) * W;
                uint8_t *row = blk + (size_t)(iy + pt) * sw * WPs * 4;
                if (sw > 2) {
                    for (long ix = 0; ix < nx; ix++) {
                        const long wp = ix + pl;
                        uint8_t *dst = row + ((wp % sw) * WPs + wp / sw) * 4;
                        for (long i = 0; i < nc; i++) dst[i] = src[i][ix] ^ flip;
                    }
                    continue;
                }
                for (long ix = 0; ix < nx; ix += 16) {
                    const long cnt = nx - ix < 16 ? nx - ix : 16;
                    const __mmask16 k = (__mmask16)((1u << cnt) - 1u);
                    const __m128i c0 = _mm_xor_si128(_mm_maskz_loadu_epi8(k, src[0] + ix), fl);
                    const __m128i c1 = _mm_xor_si128(_mm_maskz_loadu_epi8(k, src[1] + ix), fl);
                    const __m128i c2 = _mm_xor_si128(_mm_maskz_loadu_epi8(k, src[2] + ix), fl);
                    const __m128i c3 = _mm_xor_si128(_mm_maskz_loadu_epi8(k, src[3] + ix), fl);
                    const __m128i a = _mm_unpacklo_epi8(c0, c1), b = _mm_unpacklo_epi8(c2, c3);
                    const __m128i c = _mm_unpackhi_epi8(c0, c1), d = _mm_unpackhi_epi8(c2, c3);
                    __m512i v = _mm512_castsi128_si512(_mm_unpacklo_epi16(a, b));
                    v = _mm512_inserti32x4(v, _mm_unpackhi_epi16(a, b), 1);
                    v = _mm512_inserti32x4(v, _mm_unpacklo_epi16(c, d), 2);
                    v = _mm512_inserti32x4(v, _mm_unpackhi_epi16(c, d), 3);
                    const long wp = ix + pl; /* the first pixel's padded column */
                    if (sw == 1) {
                        _mm512_mask_storeu_epi32(row + wp * 4, k, v);
                        continue;
                    }
                    /* stride 2: lanes at even padded columns to phase 0, the others to phase 1, in order */
                    const __mmask16 even = (__mmask16)((wp & 1 ? 0xAAAAu : 0x5555u) & k), odd = (__mmask16)(k & ~even);
                    const long e0 = (wp + 1) / 2, o0 = wp / 2; /* first even / odd column's index in its phase */
                    _mm512_mask_storeu_epi32(row + e0 * 4, (__mmask16)((1u << _mm_popcnt_u32(even)) - 1u),
                                             _mm512_maskz_compress_epi32(even, v));
                    _mm512_mask_storeu_epi32(row + (WPs + o0) * 4, (__mmask16)((1u << _mm_popcnt_u32(odd)) - 1u),
                                             _mm512_maskz_compress_epi32(odd, v));
                }
            }
        }
}
#pragma GCC pop_options
#endif

static _Thread_local uint8_t *tl_xp;
static _Thread_local size_t tl_xp_n;

static void tl_xp_free(void)
{
    free(tl_xp);
    tl_bytes(-(long long)tl_xp_n);
    tl_xp = NULL;
    tl_xp_n = 0;
}

/* qconv_vnni(x, w8 [ceil(M/8), KQ, 8, 4] int8, badj int32 [M], scales float32 [M], y, dims int64[20] as
 * qconv's) -> True, or False below the AVX-512 VNNI level (the caller runs qconv) */
PyObject *py_qconv_vnni(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "qconv_vnni takes 6 positional arguments");
        return NULL;
    }
#if defined(__x86_64__) || defined(_M_X64)
    if (ext_isa_level() < 3) Py_RETURN_FALSE;
    Py_buffer bd;
    if (PyObject_GetBuffer(args[5], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (bd.len != 20 * 8) {
        PyBuffer_Release(&bd);
        PyErr_SetString(PyExc_ValueError, "qconv_vnni: dims must hold 20 int64");
        return NULL;
    }
    int64_t v[20];
    memcpy(v, bd.buf, sizeof v);
    PyBuffer_Release(&bd);
    for (int i = 0; i < 16; i++)
        if (v[i] < (i == 10 || i == 11 ? 0 : 1) || v[i] > (1L << 24)) {
            PyErr_SetString(PyExc_ValueError, "qconv_vnni: bad dims");
            return NULL;
        }
    const long n = (long)v[0], C = (long)v[1], H = (long)v[2], W = (long)v[3], G = (long)v[4], M = (long)v[5];
    const long KH = (long)v[6], KW = (long)v[7], OH = (long)v[8], OW = (long)v[9], pt = (long)v[10], pl = (long)v[11];
    const long sh = (long)v[12], sw = (long)v[13], dh = (long)v[14], dw = (long)v[15];
    const int zx = (int)v[16], zy = (int)v[17], xsigned = (int)v[18], ymode = (int)v[19];
    if (G != 1 || ymode < 0 || ymode > 2 || KH * KW > 4096) {
        PyErr_SetString(PyExc_ValueError, "qconv_vnni: one group, ymode 0-2");
        return NULL;
    }
    const long CQ = (C + 3) / 4, KK = KH * KW, KQ = CQ * KK, MB = (M + QV_R - 1) / QV_R, PO = OH * OW;
    const long HP = (OH - 1) * sh + (KH - 1) * dh + 1, WP = (OW - 1) * sw + (KW - 1) * dw + 1;
    const long WPs = (WP + sw - 1) / sw;
    Py_buffer b[5];
    int got = 0;
    for (; got < 5; got++)
        if (PyObject_GetBuffer(args[got], &b[got], PyBUF_C_CONTIGUOUS | (got == 4 ? PyBUF_WRITABLE : 0)) < 0) break;
    PyObject *ret = NULL;
    long *tap = NULL;
    if (got < 5) goto done;
    if (b[0].len != (Py_ssize_t)(n * C * H * W) || b[1].len != (Py_ssize_t)(MB * KQ * QV_R * 4) ||
        b[2].len != 4 * M || b[3].len != 4 * M || b[4].len != (Py_ssize_t)((ymode == 2 ? 4 : 1) * n * M * PO)) {
        PyErr_SetString(PyExc_ValueError, "qconv_vnni: buffer sizes do not match dims");
        goto done;
    }
    const long cqstride = HP * sw * WPs; /* int32 units */
    const size_t need = (size_t)(n * CQ * cqstride) * 4 + 128; /* + what a short segment's lanes read */
    if (need > tl_xp_n) {
        uint8_t *p = (uint8_t *)realloc(tl_xp, need);
        if (!p) {
            PyErr_NoMemory();
            goto done;
        }
        if (!tl_xp) tl_at_exit(tl_xp_free);
        tl_bytes((long long)(need - tl_xp_n));
        tl_xp = p;
        tl_xp_n = need;
    }
    tap = (long *)malloc((size_t)KK * sizeof(long));
    if (!tap) {
        PyErr_NoMemory();
        goto done;
    }
    for (long ky = 0; ky < KH; ky++)
        for (long kx = 0; kx < KW; kx++)
            tap[ky * KW + kx] = (ky * dh * sw + (kx * dw) % sw) * WPs + (kx * dw) / sw;
    qv_job j;
    memset(&j, 0, sizeof j);
    j.xp = tl_xp;
    j.w = (const int8_t *)b[1].buf;
    j.badj = (const int32_t *)b[2].buf;
    j.scales = (const float *)b[3].buf;
    j.y = b[4].buf;
    j.tap = tap;
    j.n = n, j.M = M, j.MB = MB, j.CQ = CQ, j.KK = KK, j.KQ = KQ, j.HP = HP, j.WPs = WPs, j.OH = OH, j.OW = OW;
    j.sh = sh, j.sw = sw, j.cqstride = cqstride;
    j.zy = zy;
    j.ymode = ymode;
    j.lo = (ymode == 1 ? -128.0f : 0.0f) - (float)zy;
    j.hi = (ymode == 1 ? 127.0f : 255.0f) - (float)zy;
    j.nseg = OH * ((OW + 15) / 16);
    /* tasks of whole tiles, about 2^17 multiply-adds each (fixed by the shape), pooled from 2^20 in all */
    const double tile_macs = (double)QV_NS * 16 * KQ * 4 * QV_R, macs = (double)n * M * PO * KQ * 4;
    long tiles = (long)((1 << 17) / tile_macs);
    if (tiles < 1) tiles = 1;
    j.seg_per_task = QV_NS * tiles;
    j.ntask_seg = (j.nseg + j.seg_per_task - 1) / j.seg_per_task;
    const long ntasks = n * MB * j.ntask_seg;
    const uint8_t *x = (const uint8_t *)b[0].buf;
    const int zxu = xsigned ? zx + 128 : zx;
    Py_BEGIN_ALLOW_THREADS
    qv_pack_input(x, tl_xp, n, C, H, W, CQ, HP, sw, WPs, pt, pl, zxu, xsigned);
    if (ntasks > 1 && macs >= (double)(1 << 20))
        nb_pool_run(qv_task, &j, (int)ntasks);
    else
        for (long t = 0; t < ntasks; t++) qv_task(&j, (int)t);
    Py_END_ALLOW_THREADS
    ret = Py_True;
    Py_INCREF(ret);
done:
    free(tap);
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return ret;
#else
    (void)args;
    Py_RETURN_FALSE;
#endif
}
