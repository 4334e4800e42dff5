/* Entry point of nms.c for module.c's method table. */
#ifndef ONNX_PREPARED_NMS_H
#define ONNX_PREPARED_NMS_H

#include <Python.h>

PyObject *py_nms_greedy(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define NMS_METHODS \
    {"nms_greedy", (PyCFunction)(void (*)(void))py_nms_greedy, METH_FASTCALL, "NonMaxSuppression greedy pass"},

#endif
