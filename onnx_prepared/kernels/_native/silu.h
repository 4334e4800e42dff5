/* Entry point of silu.c (the LLM MLP's fused SiLU) for module.c's method table. */
#ifndef ONNX_PREPARED_SILU_H
#define ONNX_PREPARED_SILU_H

#include <Python.h>

PyObject *py_silu(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define SILU_METHODS                                                                                     \
    {"silu", (PyCFunction)(void (*)(void))py_silu, METH_FASTCALL, "y = x * sigmoid(x) [* u], float32 rows"},

#endif
