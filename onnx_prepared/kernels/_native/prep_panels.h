/* Entry points of prep_panels.c (prepack layout transforms, off the first run's critical path) for
 * module.c's method table. */
#ifndef ONNX_PREPARED_PREP_PANELS_H
#define ONNX_PREPARED_PREP_PANELS_H

#include <Python.h>
#include <stdint.h>

/* The source arrays of one 4-bit MatMulNBits node (C-contiguous): B uint8 [N][kb][bs / 2] (kc = kb * bs / 8
 * uint32 words per column), scales float [N][kb], zero points (zp_kind as nbits.h NB_ZP_*) packed uint4
 * [N][ceil(kb / 2)] or float [N][kb]. */
typedef struct {
    const uint8_t *b;
    const float *sc;
    const uint8_t *zpn;
    const float *zpf;
    int N, kb, kc, zp_kind;
} nb_src;

/* Panels p0..p1-1 of the panel16 layout (nbits.h) packed from the source: qw [p1 - p0][kc][16] words,
 * scales [p1 - p0][kb][16], zero points [p1 - p0][kb][8] bytes or [p1 - p0][kb][16] floats (none:
 * zp unused); the bytes pack_q4 writes for those panels. GIL not needed. */
void nb_pack_panels(const nb_src *s, int p0, int p1, uint8_t *qw, float *sc, void *zp);

PyObject *py_panel16_u32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define PREP_PANELS_METHODS                                                                              \
    {"panel16_u32", (PyCFunction)(void (*)(void))py_panel16_u32, METH_FASTCALL,                          \
     "dst[p, k, j] = src[16 p + j, k] over uint32 words (the panel16 transpose of a prepack)"},

#endif
