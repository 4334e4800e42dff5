/* Entry points of act.c (elementwise activations of the LLM path) for module.c's method table. */
#ifndef ONNX_PREPARED_ACT_H
#define ONNX_PREPARED_ACT_H

#include <Python.h>

PyObject *py_sigmoid(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define ACT_METHODS                                                                                      \
    {"sigmoid", (PyCFunction)(void (*)(void))py_sigmoid, METH_FASTCALL, "y = 1 / (1 + exp(-x)), float32"},

#endif
