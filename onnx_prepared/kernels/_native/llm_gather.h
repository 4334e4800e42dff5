/* GatherBlockQuantized rows of a packed uint8 table (llm_gather.c) for module.c's method table. */
#ifndef ONNX_PREPARED_LLM_GATHER_H
#define ONNX_PREPARED_LLM_GATHER_H

#include <Python.h>

PyObject *py_gbq_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define LLM_GATHER_METHODS \
    {"gbq_rows", (PyCFunction)(void (*)(void))py_gbq_rows, METH_FASTCALL, "GatherBlockQuantized rows, float32"},

#endif
