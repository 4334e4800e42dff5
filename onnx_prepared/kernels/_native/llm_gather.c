/* GatherBlockQuantized of whole rows from a packed uint8 table (genai's tied INT4 embedding: data
 * [V, K * bits / 8], scales float32 [V, K / block], zero points packed like data or absent): out[r] =
 * (q - zp) * scale per element, the difference exact in float32 and one rounding for the product, as
 * onnxruntime and the numpy path compute it. One decode token is one row: this replaces ~10 numpy calls
 * (about 25-80 us) with one pass over K elements. A negative index counts from the end; one outside
 * [-V, V) gives a row of zeros (onnxruntime's documented behaviour, as the numpy path). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "llm_gather.h"

static inline int unpack(const uint8_t *row, long i, int bits)
{
    const int per = 8 / bits;
    return (row[i / per] >> ((i % per) * bits)) & ((1 << bits) - 1);
}

/* gbq_rows(data u8 [V, W], idx int64 [n], scales f32 [V, nb], zp u8 [V, Z] | None, out f32 [n, K], bits,
 *          block, default_zp) */
PyObject *py_gbq_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "gbq_rows takes 8 arguments");
        return NULL;
    }
    const long bits = PyLong_AsLong(args[5]), block = PyLong_AsLong(args[6]), dzp = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer bd, bi, bs, bz, bo;
    memset(&bz, 0, sizeof bz);
    if (PyObject_GetBuffer(args[0], &bd, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) return NULL;
    PyObject *ret = NULL;
    int have_i = 0, have_s = 0, have_z = 0, have_o = 0;
    if (PyObject_GetBuffer(args[1], &bi, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_i = 1;
    if (PyObject_GetBuffer(args[2], &bs, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) goto done;
    have_s = 1;
    if (args[3] != Py_None) {
        if (PyObject_GetBuffer(args[3], &bz, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) goto done;
        have_z = 1;
    }
    if (PyObject_GetBuffer(args[4], &bo, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_ND) < 0) goto done;
    have_o = 1;
    if ((bits != 2 && bits != 4) || block < 1 || bd.ndim != 2 || bs.ndim != 2 || bo.ndim != 2 ||
        (have_z && bz.ndim != 2)) {
        PyErr_SetString(PyExc_ValueError, "gbq_rows: bad arguments");
        goto done;
    }
    const long V = (long)bd.shape[0], W = (long)bd.shape[1], nb = (long)bs.shape[1];
    const long n = (long)(bi.len / 8), K = (long)bo.shape[1];
    if (K != W * (8 / bits) || nb * block != K || bs.shape[0] != V || bo.shape[0] != n || bs.len != V * nb * 4 ||
        (have_z && (bz.shape[0] != V || bz.shape[1] * (8 / bits) < nb))) {
        PyErr_SetString(PyExc_ValueError, "gbq_rows: shapes do not match");
        goto done;
    }
    const int64_t *idx = (const int64_t *)bi.buf;
    const uint8_t *data = (const uint8_t *)bd.buf, *zp = have_z ? (const uint8_t *)bz.buf : NULL;
    const float *sc = (const float *)bs.buf;
    float *out = (float *)bo.buf;
    const long zw = have_z ? (long)bz.shape[1] : 0;
    Py_BEGIN_ALLOW_THREADS
    for (long r = 0; r < n; r++) {
        float *o = out + r * K;
        const int64_t x = idx[r] < 0 ? idx[r] + V : idx[r];
        if (x < 0 || x >= V) {
            memset(o, 0, sizeof(float) * (size_t)K);
            continue;
        }
        const uint8_t *row = data + x * W;
        const float *s = sc + x * nb;
        for (long blk = 0; blk < nb; blk++) {
            const float z = (float)(zp ? unpack(zp + x * zw, blk, (int)bits) : dzp), f = s[blk];
            const long i0 = blk * block;
            if (bits == 4)
                for (long i = i0; i < i0 + block; i += 2) {
                    const uint8_t v = row[i / 2];
                    o[i] = ((float)(v & 15) - z) * f;
                    o[i + 1] = ((float)(v >> 4) - z) * f;
                }
            else
                for (long i = i0; i < i0 + block; i++) o[i] = ((float)unpack(row, i, (int)bits) - z) * f;
        }
    }
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (have_o) PyBuffer_Release(&bo);
    if (have_z) PyBuffer_Release(&bz);
    if (have_s) PyBuffer_Release(&bs);
    if (have_i) PyBuffer_Release(&bi);
    PyBuffer_Release(&bd);
    return ret;
}
