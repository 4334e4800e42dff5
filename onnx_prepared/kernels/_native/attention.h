/* GroupQueryAttention (float32, onnxruntime's CPU semantics) for module.c's method table: the job that
 * attention.c fills and checks, and the per-ISA task of attention.inc (attention_isa.c). */
#ifndef ONNX_PREPARED_ATTENTION_H
#define ONNX_PREPARED_ATTENTION_H

#include <Python.h>

#include <stdint.h>

typedef struct {
    /* rows of the new tokens: q/k/v row (b, j) starts at base + (b * S + j) * stride */
    const float *q, *k, *v;
    long q_stride, kv_stride;
    const float *past_k, *past_v; /* [B, kvh, L_past, H] or NULL */
    float *present_k, *present_v; /* [B, kvh, P, H] */
    float *out;                   /* [B, S, nh * H] */
    const int32_t *seqlens;       /* [B]: total length - 1 */
    const float *cos, *sin;       /* [cos_rows, half] or NULL (no rotary) */
    const int64_t *pos;           /* [B, S] position_ids (pos_mode 2) */
    const float *head_sink;       /* [nh] or NULL */
    long B, S, nh, kvh, H, L_past, P, half;
    long window;                /* local_window_size (<= 0: none) */
    long pos0;                  /* pos_mode 1: first position of every entry */
    int first, causal, interleaved, pos_mode, smooth; /* pos_mode 0: past + j, 1: pos0 + j, 2: pos[] */
    float scale, softcap;
    int flash;    /* onnxruntime's flash path (no softcap or sink, total > 1): key blocks of kv_block */
    long kv_block; /* keys per block: L2 / (32 H) bytes as onnxruntime sizes them, at least 1 */
    long q_block;  /* query rows per block there: min(that, 2 H) (a lone row takes MLAS's M = 1 kernel) */
    int exp8;     /* softmax's exp and sum in MLAS's AVX2 (FMA3) order, not its AVX-512F one (gqa_cpu_order) */
    int failed;   /* set by a task whose scratch allocation failed */
} gqa_job;


/* task = b * kvh + kv head: writes that head's present K/V and the output of its query heads */
void gqa_task_portable(gqa_job *j, int task);
void gqa_task_avx2(gqa_job *j, int task);
void gqa_task_avx512(gqa_job *j, int task);

PyObject *py_gqa(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_gqa_cpu_order(PyObject *self, PyObject *unused);

#define ATTENTION_METHODS \
    {"gqa", (PyCFunction)(void (*)(void))py_gqa, METH_FASTCALL, "GroupQueryAttention, float32 KV cache (BNSH)"}, \
    {"gqa_cpu_order", (PyCFunction)py_gqa_cpu_order, METH_NOARGS, \
     "1 where onnxruntime's MLAS runs its AVX2 softmax kernels (no AVX-512F), 0 where its AVX-512F ones"},

#endif
