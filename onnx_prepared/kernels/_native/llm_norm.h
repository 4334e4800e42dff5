/* Entry point of llm_norm.c (RMS norms of the LLM path) for module.c's method table. */
#ifndef ONNX_PREPARED_LLM_NORM_H
#define ONNX_PREPARED_LLM_NORM_H

#include <Python.h>

typedef struct norm_job {
    const float *x, *skip, *bias, *gamma;
    float *y, *sum, *inv;
    long rows, n, rows_per_task;
    float eps;
    void (*plain)(const struct norm_job *, long);       /* one row of the plain norm */
    void (*skip_rows)(const struct norm_job *, long, int); /* up to 8 rows of the skip norm */
} norm_job;

/* the rows of llm_norm.inc, one build per ISA (llm_norm_isa.c) */
void norm_plain_row_portable(const norm_job *j, long r);
void norm_plain_row_avx2(const norm_job *j, long r);
void norm_plain_row_avx512(const norm_job *j, long r);
void norm_skip_rows_portable(const norm_job *j, long r0, int nr);
void norm_skip_rows_avx2(const norm_job *j, long r0, int nr);
void norm_skip_rows_avx512(const norm_job *j, long r0, int nr);

PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define LLM_NORM_METHODS \
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL, "(skip) RMS norm over rows, float32"},

#endif
