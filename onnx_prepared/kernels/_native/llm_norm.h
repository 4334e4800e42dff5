/* Entry point of llm_norm.c (RMS norms of the LLM path) for module.c's method table. */
#ifndef ONNX_PREPARED_LLM_NORM_H
#define ONNX_PREPARED_LLM_NORM_H

#include <Python.h>

PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define LLM_NORM_METHODS \
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL, "(skip) RMS norm over rows, float32"},

#endif
