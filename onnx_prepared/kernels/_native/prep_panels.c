/* The panel16 transpose of a MatMulNBits prepack (and nb_pack_panels: a panel range packed from the
 * source arrays, for matmul_q4_source): rows of 16 columns' words interleaved so that a panel
 * reads one 64-byte line per k, each word's nibbles reordered for layout v2 (nbits.h: byte i = k values i
 * and i + 4 of the chunk; the source has k value j in nibble j). numpy does it as a strided copy whose inner loop is 16 elements long
 * (about 17x slower than a plain copy of the same bytes); here it is 16 x 16 blocks, one panel at a
 * time, with the GIL released (a prepack runs beside the first inference). */
#include "prep_panels.h"

#include "nbits.h"

#include <stdint.h>
#include <string.h>

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

static void panel16(const uint32_t *restrict src, uint32_t *restrict dst, size_t P, size_t kc)
{
    for (size_t p = 0; p < P; p++) panel16_one((const uint8_t *)(src + p * 16 * kc), dst + p * kc * 16, kc, 16);
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

void nb_pack_panels(const nb_src *s, int p0, int p1, uint8_t *qw, float *sc, void *zp)
{
    const size_t kc = (size_t)s->kc;
    for (int p = p0; p < p1; p++) {
        const int n0 = 16 * p, ncols = s->N - n0 < 16 ? s->N - n0 : 16;
        panel16_one(s->b + (size_t)n0 * kc * 4, (uint32_t *)(qw + (size_t)(p - p0) * kc * 64), kc, ncols);
    }
    panel16_f32(s->sc, sc, s->N, s->kb, p0, p1);
    if (s->zp_kind == NB_ZP_F32) {
        panel16_f32(s->zpf, (float *)zp, s->N, s->kb, p0, p1);
    } else if (s->zp_kind == NB_ZP_U4) { /* source rows of ceil(kb / 2) bytes, block b in nibble b & 1 of byte b / 2 */
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
