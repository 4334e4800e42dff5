/* The panel16 transpose of a MatMulNBits prepack: rows of 16 columns' words interleaved so that a panel
 * reads one 64-byte line per k, each word's nibbles reordered for layout v2 (nbits.h: byte i = k values i
 * and i + 4 of the chunk; the source has k value j in nibble j). numpy does it as a strided copy whose inner loop is 16 elements long
 * (about 17x slower than a plain copy of the same bytes); here it is 16 x 16 blocks, one panel at a
 * time, with the GIL released (a prepack runs beside the first inference). */
#include "prep_panels.h"

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

static void panel16(const uint32_t *restrict src, uint32_t *restrict dst, size_t P, size_t kc)
{
    for (size_t p = 0; p < P; p++) {
        const uint32_t *s = src + p * 16 * kc;
        uint32_t *d = dst + p * kc * 16;
        size_t k0 = 0;
        for (; k0 + 16 <= kc; k0 += 16) {
            uint32_t blk[16][16];
            /* the nibble interleave on contiguous rows (a vector loop), then the 16 x 16 transpose:
             * interleaving during the transpose (strided words) made it scalar, ~3x slower */
            for (int j = 0; j < 16; j++) {
                const uint32_t *row = s + (size_t)j * kc + k0;
                for (int k = 0; k < 16; k++) blk[j][k] = interleave(row[k]);
            }
            for (int k = 0; k < 16; k++)
                for (int j = 0; j < 16; j++) d[(k0 + k) * 16 + j] = blk[j][k];
        }
        for (size_t k = k0; k < kc; k++)
            for (int j = 0; j < 16; j++) d[k * 16 + j] = interleave(s[(size_t)j * kc + k]);
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
