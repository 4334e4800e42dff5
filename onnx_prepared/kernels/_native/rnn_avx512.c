/* The recurrence compiled for AVX-512 (level avx512vnni); the AVX2 build elsewhere. */
#include "rnn.h"
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f,avx512vl,fma,prefer-vector-width=512")
#endif
#define RNN_ENTRY rnn_run_avx512
#define RNN_PROJECT rnn_project_avx512
#include "rnn_step.inc"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
void rnn_run_avx512(const rnn_args *a) { rnn_run_avx2(a); }
void rnn_project_avx512(float *xw, const float *x, const float *wt, const float *bias, long rows, int K, int N)
{
    rnn_project_avx2(xw, x, wt, bias, rows, K, N);
}
#endif
