/* Portable scalar MatMulNBits kernels: the reference the SIMD files are tested against. */
#include "nbits_prep.h"

static inline float nb_zp(const nb_weights *w, int p, int b, int l)
{
    if (w->zp_kind == NB_ZP_U4) {
        uint8_t v = w->zpn[((size_t)p * w->kb + b) * 8 + (l >> 1)];
        return (float)((l & 1) ? v >> 4 : v & 15);
    }
    if (w->zp_kind == NB_ZP_F32) return w->zpf[((size_t)p * w->kb + b) * 16 + l];
    return 8.f;
}

/* nibble of k value j (0..7) of a chunk word (layout v2, nbits.h) */
static inline int nb_q(uint32_t word, int j)
{
    return (int)((word >> (4 * NB_KPOS(j))) & 15u);
}

/* int32 dot of quad qd (k 4qd..4qd+3) of block b with A, per column of the panel */
static void quad_dots(const nb_call *c, const uint8_t *qp, const int8_t *a, int b, int qd, int32_t out[16])
{
    const int cpb = c->w.bs / 8, ci = qd >> 1, h = qd & 1;
    uint32_t words[16];
    memcpy(words, qp + ((size_t)b * cpb + ci) * 64, 64);
    const int8_t *g = a + (size_t)b * c->w.bs + 8 * ci + 4 * h;
    for (int l = 0; l < 16; l++) {
        int32_t t = 0;
        for (int j = 0; j < 4; j++) t += nb_q(words[l], 4 * h + j) * g[j];
        out[l] = t;
    }
}

/* int8, one row x one panel: the order of nbits.h (onnxruntime's at block 32) */
static void i8_row(const nb_call *c, int m, int p)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, N = w->N, n0 = 16 * p, n4 = N & ~3;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const int8_t *a = c->aq + (size_t)m * c->kpad;
    const float *asc = c->ascale + (size_t)m * kb, *ablk = c->asum + (size_t)m * kb;
    float y[16], s[16];
    int32_t d0[16], d1[16];
    if (w->bs == 32) {
        float F[16][16] = {{0.f}}, G[8][16];
        const int kb4 = kb & ~3;
        for (int b = 0; b < kb4; b++) {
            const int beta = b & 3, base = (beta & 1) * 8 + (beta >> 1) * 2;
            for (int l = 0; l < 16; l++) s[l] = sp[(size_t)b * 16 + l] * asc[b];
            for (int i = 0; i < 2; i++)
                for (int h = 0; h < 2; h++) {
                    quad_dots(c, qp, a, b, 4 * i + h, d0);
                    quad_dots(c, qp, a, b, 4 * i + h + 2, d1);
                    float *f = F[base + 4 * i + h];
                    for (int l = 0; l < 16; l++) f[l] = fmaf((float)(d0[l] + d1[l]), s[l], f[l]);
                }
        }
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 16; l++) G[j][l] = F[j][l] + F[j + 8][l];
        for (int b = kb4; b < kb; b++) {
            for (int l = 0; l < 16; l++) s[l] = asc[b] * sp[(size_t)b * 16 + l];
            for (int qd = 0; qd < 8; qd++) {
                quad_dots(c, qp, a, b, qd, d0);
                for (int l = 0; l < 16; l++) G[qd][l] = fmaf((float)d0[l], s[l], G[qd][l]);
            }
        }
        for (int l = 0; l < 16; l++) {
            float t;
            if (n0 + l < n4) {
                const float lo = ((G[0][l] + G[1][l]) + G[2][l]) + G[3][l];
                const float hi = ((G[4][l] + G[5][l]) + G[6][l]) + G[7][l];
                t = lo + hi;
            } else {
                const float e = (G[4][l] + G[0][l]) + (G[6][l] + G[2][l]);
                const float o = (G[5][l] + G[1][l]) + (G[7][l] + G[3][l]);
                t = e + o;
            }
            y[l] = t;
        }
    } else {
        for (int l = 0; l < 16; l++) y[l] = 0.f;
        for (int b = 0; b < kb; b++) {
            for (int l = 0; l < 16; l++) s[l] = sp[(size_t)b * 16 + l] * asc[b];
            int32_t t[16] = {0};
            for (int qd = 0; qd < w->bs / 4; qd++) {
                quad_dots(c, qp, a, b, qd, d0);
                for (int l = 0; l < 16; l++) t[l] += d0[l];
            }
            for (int l = 0; l < 16; l++) y[l] = fmaf((float)t[l], s[l], y[l]);
        }
    }
    float *out = c->y + (size_t)m * N + n0;
    const int ncols = N - n0 < 16 ? N - n0 : 16;
    for (int l = 0; l < ncols; l++) {
        float z = 0.f;
        for (int b = 0; b < kb; b++) {
            const float sb = sp[(size_t)b * 16 + l];
            const float zs = w->zp_kind == NB_ZP_NONE ? sb : sb * nb_zp(w, p, b, l);
            z = fmaf(-ablk[b], zs, z);
        }
        float v = y[l];
        if (c->bias) v = v + c->bias[n0 + l];
        out[l] = v + z;
    }
}

static void gemm_portable(const nb_call *c, int m0, int m1, int p0, int p1)
{
    const nb_weights *w = &c->w;
    const int cpb = w->bs / 8, N = w->N;
    for (int p = p0; p < p1; p++) {
        const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
        const float *sp = w->sc + (size_t)p * w->kb * 16;
        const int ncols = N - 16 * p < 16 ? N - 16 * p : 16;
        for (int m = m0; m < m1; m++) {
            if (c->mode == NB_MODE_I8) {
                i8_row(c, m, p);
                continue;
            }
            float yacc[16] = {0};
            const float *asum = c->asum + (size_t)m * w->kb;
            for (int b = 0; b < w->kb; b++) {
                const float *s = sp + (size_t)b * 16;
                const float *af = c->af + (size_t)m * c->kpad + (size_t)b * w->bs;
                float acc[16] = {0};
                for (int ci = 0; ci < cpb; ci++) {
                    uint32_t words[16];
                    memcpy(words, qp + ((size_t)b * cpb + ci) * 64, 64);
                    for (int j = 0; j < 8; j++) {
                        const float av = af[8 * ci + j];
                        for (int l = 0; l < 16; l++) acc[l] += (float)nb_q(words[l], j) * av;
                    }
                }
                for (int l = 0; l < 16; l++) yacc[l] += s[l] * (acc[l] - nb_zp(w, p, b, l) * asum[b]);
            }
            float *y = c->y + (size_t)m * N + 16 * p;
            for (int l = 0; l < ncols; l++) y[l] = yacc[l] + (c->bias ? c->bias[16 * p + l] : 0.f);
        }
    }
}

const nb_isa nb_isa_portable = {"portable", nb_prep_rows, gemm_portable};

size_t nb_scratch_bytes(int M, int K, int bs, int mode)
{
    const size_t kb = (size_t)((K + bs - 1) / bs), kpad = kb * (size_t)bs;
    const size_t rows = ((size_t)M + 7) & ~(size_t)7; /* whole 8-row tiles (nbits_avx512vnni.c) */
    size_t n = rows * kb * 4 * 2; /* ascale + asum (ascale unused in fp32 mode) */
    n += mode == NB_MODE_F32 ? rows * kpad * 4 : rows * kpad;
    return n + 64;
}

void nb_layout_scratch(nb_call *c, void *scratch)
{
    const size_t rows = ((size_t)c->M + 7) & ~(size_t)7, kb = (size_t)c->w.kb, kpad = (size_t)c->kpad;
    uint8_t *p = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    c->asum = (float *)p;
    c->ascale = (float *)(p + rows * kb * 4);
    uint8_t *rest = p + rows * kb * 8;
    c->af = (float *)rest;
    c->aq = (int8_t *)rest;
    (void)kpad;
}
