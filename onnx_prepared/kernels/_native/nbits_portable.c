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

static void gemm_portable(const nb_call *c, int m0, int m1, int p0, int p1)
{
    const nb_weights *w = &c->w;
    const int cpb = w->bs / 8, N = w->N;
    for (int p = p0; p < p1; p++) {
        const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
        const float *sp = w->sc + (size_t)p * w->kb * 16;
        const int ncols = N - 16 * p < 16 ? N - 16 * p : 16;
        for (int m = m0; m < m1; m++) {
            float yacc[16] = {0};
            const float *asum = c->asum + (size_t)m * w->kb;
            for (int b = 0; b < w->kb; b++) {
                const float *s = sp + (size_t)b * 16;
                if (c->mode == NB_MODE_F32) {
                    const float *af = c->af + (size_t)m * c->kpad + (size_t)b * w->bs;
                    float acc[16] = {0};
                    for (int ci = 0; ci < cpb; ci++) {
                        uint32_t words[16];
                        memcpy(words, qp + ((size_t)b * cpb + ci) * 64, 64);
                        for (int j = 0; j < 8; j++) {
                            const float av = af[8 * ci + j];
                            for (int l = 0; l < 16; l++) acc[l] += (float)((words[l] >> (4 * j)) & 15u) * av;
                        }
                    }
                    for (int l = 0; l < 16; l++) yacc[l] += s[l] * (acc[l] - nb_zp(w, p, b, l) * asum[b]);
                } else {
                    const int8_t *aq = c->aq + (size_t)m * c->kpad + (size_t)b * w->bs;
                    const float as = c->ascale[(size_t)m * w->kb + b];
                    int32_t acc[16] = {0};
                    for (int ci = 0; ci < cpb; ci++) {
                        uint32_t words[16];
                        memcpy(words, qp + ((size_t)b * cpb + ci) * 64, 64);
                        const int8_t *g = aq + 8 * ci;
                        for (int l = 0; l < 16; l++) {
                            int32_t t = 0;
                            for (int j = 0; j < 8; j++) {
                                const int q = (int)((words[l] >> (4 * j)) & 15u);
                                t += q * g[(j & 1) ? 4 + (j >> 1) : (j >> 1)];
                            }
                            acc[l] += t;
                        }
                    }
                    for (int l = 0; l < 16; l++)
                        yacc[l] += ((float)acc[l] - nb_zp(w, p, b, l) * asum[b]) * (s[l] * as);
                }
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
    size_t n = rows * kb * 4 * 3; /* ascale + asum + acorr (ascale, acorr unused in fp32 mode) */
    n += mode == NB_MODE_F32 ? rows * kpad * 4 : rows * kpad;
    return n + 64;
}

void nb_layout_scratch(nb_call *c, void *scratch)
{
    const size_t rows = ((size_t)c->M + 7) & ~(size_t)7, kb = (size_t)c->w.kb, kpad = (size_t)c->kpad;
    uint8_t *p = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    c->asum = (float *)p;
    c->ascale = (float *)(p + rows * kb * 4);
    c->acorr = (float *)(p + rows * kb * 8);
    uint8_t *rest = p + rows * kb * 12;
    c->af = (float *)rest;
    c->aq = (int8_t *)rest;
    (void)kpad;
}
