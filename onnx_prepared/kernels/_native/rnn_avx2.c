/* The recurrence compiled for AVX2 + FMA (levels avx2 and up); the portable build elsewhere. */
#include "rnn.h"
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx2,fma")
#endif
#define RNN_ENTRY rnn_run_avx2
#define RNN_PROJECT rnn_project_avx2
#include "rnn_step.inc"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
void rnn_run_avx2(const rnn_args *a) { rnn_run_portable(a); }
void rnn_project_avx2(float *xw, const float *x, const float *wt, const float *bias, long rows, int K, int N)
{
    rnn_project_portable(xw, x, wt, bias, rows, K, N);
}
#endif
