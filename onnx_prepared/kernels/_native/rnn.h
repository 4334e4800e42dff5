/* LSTM / GRU / RNN recurrence: one call runs one direction over the whole sequence.
 *
 * The caller computes the input projection of every step beforehand (one GEMM: xw = X W^T + biases)
 * and passes it with the recurrent weights transposed (rt = R^T, [H][G*H], gates in ONNX order: LSTM
 * i o f c, GRU z r h, RNN one). Each step multiplies the valid rows' states by rt and applies the gate
 * activations in place; states are updated in place. Row b is valid at step t when t < lens[b]; it
 * reads and writes time position t (forward) or lens[b]-1-t (reverse). Y rows of invalid positions
 * are not written (the caller zero-fills Y), and the final state of a zero-length row is zeros
 * (onnxruntime's convention). */
#ifndef ONNX_PREPARED_RNN_H
#define ONNX_PREPARED_RNN_H

#include <stddef.h>
#include <stdint.h>

enum { RNN_KIND_RNN = 0, RNN_KIND_GRU = 1, RNN_KIND_LSTM = 2 };
enum {
    RNN_SIGMOID = 0, RNN_TANH, RNN_RELU, RNN_AFFINE, RNN_LEAKYRELU, RNN_THRESHOLDEDRELU, RNN_SCALEDTANH,
    RNN_HARDSIGMOID, RNN_ELU, RNN_SOFTSIGN, RNN_SOFTPLUS, RNN_NACT
};

typedef struct {
    int kind, seq, batch, hidden, gates, reverse, input_forget, linear_before_reset, has_clip;
    int act[3];           /* LSTM f g h, GRU f g, RNN f */
    float alpha[3], beta[3], clip;
    const float *xw;      /* row (t, b) at xw + (t * batch + b) * xw_stride, this direction's gates first */
    long xw_stride;
    const float *rt;      /* [H][G*H] */
    float *h, *c;         /* [batch][H] in: initial state, out: final state (c: LSTM only) */
    float *y;             /* NULL, or row (t, b) at y + t * y_tstride + b * H */
    long y_tstride;
    const int32_t *lens;  /* NULL: every row spans seq */
    const float *p;       /* LSTM peepholes i o f [3][H], or NULL */
    const float *rbh;     /* GRU with linear_before_reset: the recurrent bias of h [H], or NULL */
    float *scratch;       /* rnn_scratch_bytes() */
} rnn_args;

static inline size_t rnn_scratch_bytes(int batch, int hidden, int gates)
{
    return 4 * (size_t)batch * ((size_t)gates * hidden + 2 * (size_t)hidden) + 8 * (size_t)batch + 64;
}

void rnn_run_portable(const rnn_args *a);
void rnn_run_avx2(const rnn_args *a);
void rnn_run_avx512(const rnn_args *a);

/* The input projection of every step: xw[r][0:N] = bias (or 0) + sum_k x[r][k] * wt[k][0:N] for r < rows
 * (x [rows][K], wt = W^T [K][N], xw [rows][N]); for layers small enough that a BLAS call costs more than
 * the arithmetic (rnn_module.c picks). */
void rnn_project_portable(float *xw, const float *x, const float *wt, const float *bias, long rows, int K, int N);
void rnn_project_avx2(float *xw, const float *x, const float *wt, const float *bias, long rows, int K, int N);
void rnn_project_avx512(float *xw, const float *x, const float *wt, const float *bias, long rows, int K, int N);

#endif
