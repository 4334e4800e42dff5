/* Entry points of act.c (elementwise activations of the LLM path) for module.c's method table. */
#ifndef ONNX_PREPARED_ACT_H
#define ONNX_PREPARED_ACT_H

#include <Python.h>

PyObject *py_sigmoid(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_hardswish(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_relu(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define ACT_METHODS                                                                                      \
    {"sigmoid", (PyCFunction)(void (*)(void))py_sigmoid, METH_FASTCALL, "y = 1 / (1 + exp(-x)), float32"}, \
    {"hardswish", (PyCFunction)(void (*)(void))py_hardswish, METH_FASTCALL, "y = x * clip(x / 6 + 1 / 2, 0, 1), float32"}, \
    {"relu", (PyCFunction)(void (*)(void))py_relu, METH_FASTCALL, "y = maximum(x, 0) as numpy, float32"},

#endif
