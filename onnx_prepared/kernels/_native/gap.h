/* Entry point of gap.c for module.c's method table. */
#ifndef ONNX_PREPARED_GAP_H
#define ONNX_PREPARED_GAP_H

#include <Python.h>

PyObject *py_global_avg(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_global_max(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define GAP_METHODS \
    {"global_avg", (PyCFunction)(void (*)(void))py_global_avg, METH_FASTCALL, "mean of each float32 plane"}, \
    {"global_max", (PyCFunction)(void (*)(void))py_global_max, METH_FASTCALL, "max of each float32 plane"},

#endif
