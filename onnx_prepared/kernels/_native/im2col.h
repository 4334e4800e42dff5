/* Entry point of im2col.c for module.c's method table. */
#ifndef ONNX_PREPARED_IM2COL_H
#define ONNX_PREPARED_IM2COL_H

#include <Python.h>

PyObject *py_im2col2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* im2col_direct.c: a unit-stride Conv on the prepacked SGEMM's panels without the column matrix */
PyObject *py_conv_direct(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* im2col.c: the copies that tile an output, ConvTranspose's col2im at stride = kernel and Resize's
 * nearest repetition by whole factors */
PyObject *py_col2im_tiled(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_nearest_repeat2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define IM2COL_METHODS \
    {"im2col2d", (PyCFunction)(void (*)(void))py_im2col2d, METH_FASTCALL, "2-D im2col for Conv, over the pool"}, \
    {"conv_direct", (PyCFunction)(void (*)(void))py_conv_direct, METH_FASTCALL, "unit-stride 2-D Conv, packed weights"}, \
    {"col2im_tiled", (PyCFunction)(void (*)(void))py_col2im_tiled, METH_FASTCALL, "ConvTranspose col2im, stride = kernel"}, \
    {"nearest_repeat2d", (PyCFunction)(void (*)(void))py_nearest_repeat2d, METH_FASTCALL, "nearest x whole factors"},

#endif
