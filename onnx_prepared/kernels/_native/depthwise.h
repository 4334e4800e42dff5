/* Entry point of depthwise.c for module.c's method table. */
#ifndef ONNX_PREPARED_DEPTHWISE_H
#define ONNX_PREPARED_DEPTHWISE_H

#include <Python.h>

PyObject *py_depthwise2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define DEPTHWISE_METHODS \
    {"depthwise2d", (PyCFunction)(void (*)(void))py_depthwise2d, METH_FASTCALL, "2-D depthwise Conv, NCHW"},

#endif
