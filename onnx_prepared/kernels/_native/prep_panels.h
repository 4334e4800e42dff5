/* Entry points of prep_panels.c (prepack layout transforms, off the first run's critical path) for
 * module.c's method table. */
#ifndef ONNX_PREPARED_PREP_PANELS_H
#define ONNX_PREPARED_PREP_PANELS_H

#include <Python.h>

PyObject *py_panel16_u32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define PREP_PANELS_METHODS                                                                              \
    {"panel16_u32", (PyCFunction)(void (*)(void))py_panel16_u32, METH_FASTCALL,                          \
     "dst[p, k, j] = src[16 p + j, k] over uint32 words (the panel16 transpose of a prepack)"},

#endif
