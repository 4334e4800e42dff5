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

/* int32 dot of the k pair (2pr, 2pr + 1) of block b with A, per column (block 16's trailing blocks) */
static void pair_dots(const nb_call *c, const uint8_t *qp, const int8_t *a, int b, int pr, int32_t out[16])
{
    const int cpb = c->w.bs / 8, ci = pr >> 2, j = 2 * (pr & 3);
    uint32_t words[16];
    memcpy(words, qp + ((size_t)b * cpb + ci) * 64, 64);
    const int8_t *g = a + (size_t)b * c->w.bs + 8 * ci;
    for (int l = 0; l < 16; l++) out[l] = nb_q(words[l], j) * g[j] + nb_q(words[l], j + 1) * g[j + 1];
}

/* F[cls] = fma(quad qa + quad qb of block b, s, F[cls]) for the 16 columns */
static void chain2(const nb_call *c, const uint8_t *qp, const int8_t *a, int b, int qa, int qb, const float *s,
                   float *f)
{
    int32_t d0[16], d1[16];
    quad_dots(c, qp, a, b, qa, d0);
    quad_dots(c, qp, a, b, qb, d1);
    for (int l = 0; l < 16; l++) f[l] = fmaf((float)(d0[l] + d1[l]), s[l], f[l]);
}

/* int8, one row x one panel: the order of nbits.h (onnxruntime's, per block size) */
static void i8_row(const nb_call *c, int m, int p)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, N = w->N, n0 = 16 * p, n4 = N & ~3, bs = w->bs;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const int8_t *a = c->aq + (size_t)m * c->kpad;
    const float *asc = c->ascale + (size_t)m * kb, *ablk = c->asum + (size_t)m * kb;
    const int r1 = (c->M & 1) && m == c->M - 1; /* onnxruntime's odd last row (blocks 64-256) */
    float y[16], s[16], F[16][16] = {{0.f}}, G[8][16];
    int32_t d0[16];
    if (bs == 16 || bs == 32) {
        const int grp = bs == 16 ? 8 : 4, kbg = kb / grp * grp;
        for (int b = 0; b < kbg; b++) {
            const int beta = b % grp;
            for (int l = 0; l < 16; l++) s[l] = sp[(size_t)b * 16 + l] * asc[b];
            if (bs == 16) {
                const int base = 4 * (beta & 3) + (beta < 4 ? 0 : 2);
                for (int u = 0; u < 2; u++) chain2(c, qp, a, b, u, u + 2, s, F[base + u]);
            } else {
                const int base = (beta & 1) * 8 + (beta >> 1) * 2;
                for (int i = 0; i < 2; i++)
                    for (int h = 0; h < 2; h++) chain2(c, qp, a, b, 4 * i + h, 4 * i + h + 2, s, F[base + 4 * i + h]);
            }
        }
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 16; l++) G[j][l] = F[j][l] + F[j + 8][l];
        for (int b = kbg; b < kb; b++) {
            for (int l = 0; l < 16; l++) s[l] = asc[b] * sp[(size_t)b * 16 + l];
            for (int j = 0; j < 8; j++) { /* block 16: k pairs; block 32: quads */
                if (bs == 16)
                    pair_dots(c, qp, a, b, j, d0);
                else
                    quad_dots(c, qp, a, b, j, d0);
                for (int l = 0; l < 16; l++) G[j][l] = fmaf((float)d0[l], s[l], G[j][l]);
            }
        }
        for (int l = 0; l < 16; l++) {
            if (n0 + l < n4) {
                const float lo = ((G[0][l] + G[1][l]) + G[2][l]) + G[3][l];
                const float hi = ((G[4][l] + G[5][l]) + G[6][l]) + G[7][l];
                y[l] = lo + hi;
            } else {
                const float e = (G[4][l] + G[0][l]) + (G[6][l] + G[2][l]);
                const float o = (G[5][l] + G[1][l]) + (G[7][l] + G[3][l]);
                y[l] = e + o;
            }
        }
    } else {
        if (bs == 64) {
            for (int b = 0; b < (kb & ~1); b++) {
                const int beta = b & 1;
                for (int l = 0; l < 16; l++) s[l] = sp[(size_t)b * 16 + l] * asc[b];
                for (int L = 0; L < 4; L++) {
                    chain2(c, qp, a, b, 4 * L, 4 * L + 2, s, F[4 * L + beta]);
                    chain2(c, qp, a, b, 4 * L + 1, 4 * L + 3, s, F[4 * L + beta + 2]);
                }
            }
            if (kb & 1) { /* the last block of an odd count: one quad per chain */
                const int b = kb - 1;
                for (int l = 0; l < 16; l++) s[l] = asc[b] * sp[(size_t)b * 16 + l];
                for (int j = 0; j < 16; j++) {
                    quad_dots(c, qp, a, b, j, d0);
                    for (int l = 0; l < 16; l++) F[j][l] = fmaf((float)d0[l], s[l], F[j][l]);
                }
            }
        } else { /* 128, 256: per 128 k values, chain j gets quads j and 16 + j */
            for (int b = 0; b < kb; b++) {
                for (int l = 0; l < 16; l++) s[l] = asc[b] * sp[(size_t)b * 16 + l];
                for (int sb = 0; sb < bs / 128; sb++)
                    for (int j = 0; j < 16; j++) chain2(c, qp, a, b, 32 * sb + j, 32 * sb + 16 + j, s, F[j]);
            }
        }
        for (int l = 0; l < 16; l++) {
            if (r1 && n0 + l < n4) { /* MLAS FoldAccumulators */
                float S[4];
                for (int L = 0; L < 4; L++) S[L] = ((F[4 * L][l] + F[4 * L + 1][l]) + F[4 * L + 2][l]) + F[4 * L + 3][l];
                y[l] = (S[0] + S[2]) + (S[1] + S[3]);
            } else { /* _mm512_reduce_add_ps / hsum_float_16 */
                float h[8], t[4];
                for (int j = 0; j < 8; j++) h[j] = F[j][l] + F[j + 8][l];
                for (int i = 0; i < 4; i++) t[i] = h[4 + i] + h[i];
                y[l] = (t[0] + t[2]) + (t[1] + t[3]);
            }
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

/* ---- int8 in the order of MLAS's AVX2 kernels (NB_MODE_I8_AVX2*, nbits.h) ---- */
static const int NB_LC[8] = {0, 1, 4, 5, 2, 3, 6, 7};

/* int32 dot of the n k values from k0 (inside one block) with A, per column, of q - zs[l] */
static void kdots(const uint8_t *qp, const int8_t *a, int k0, int n, const int32_t *zs, int32_t out[16])
{
    for (int l = 0; l < 16; l++) {
        int32_t t = 0;
        for (int k = k0; k < k0 + n; k++) {
            uint32_t word;
            memcpy(&word, qp + (size_t)(k >> 3) * 64 + 4 * l, 4);
            t += (nb_q(word, k & 7) - zs[l]) * a[k];
        }
        out[l] = t;
    }
}

static void i8_row_avx2(const nb_call *c, int m, int p)
{
    const nb_weights *w = &c->w;
    const int kb = w->kb, N = w->N, n0 = 16 * p, n4 = N & ~3, bs = w->bs;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * kb * 16;
    const int8_t *a = c->aq + (size_t)m * c->kpad;
    const float *asc = c->ascale + (size_t)m * kb, *ablk = c->asum + (size_t)m * kb;
    const int m1 = NB_M1ROW(c, m), vnni = c->mode == NB_MODE_I8_AVX2VNNI && bs >= 64 && !m1;
    float X[8][16] = {{0.f}}, s[16], y[16];
    int32_t d[16], d2[16], zs[16];
#define NB_BLOCK(b)                                                                          \
    for (int l = 0; l < 16; l++) {                                                           \
        s[l] = asc[b] * sp[(size_t)(b) * 16 + l];                                            \
        zs[l] = m1 ? (int32_t)nb_zp(w, p, b, l) : 0;                                         \
    }
    int tb = kb; /* first trailing block */
    if (m1 && bs == 32 && w->zp_kind == NB_ZP_U4) {
        tb = 0;
    } else {
        const int ng = bs >= 64 ? kb * (bs / 64) : kb / (64 / bs);
        tb = bs >= 64 ? kb : ng * (64 / bs);
        for (int g = 0; g < ng; g++)
            for (int l = 0; l < 8; l++) {
                const int k0 = vnni ? 64 * g : 64 * g + 8 * NB_LC[l];
                NB_BLOCK(k0 / bs)
                if (vnni) {
                    kdots(qp, a, k0 + 4 * l, 4, zs, d);
                    kdots(qp, a, k0 + 32 + 4 * l, 4, zs, d2);
                    for (int j = 0; j < 16; j++) d[j] += d2[j];
                } else {
                    kdots(qp, a, k0, 8, zs, d);
                }
                for (int j = 0; j < 16; j++) X[l][j] = fmaf((float)d[j], s[j], X[l][j]);
            }
    }
    for (int b = tb; b < kb; b++) { /* chain l: quad l (block 32) or k pair l (block 16) */
        const int step = bs == 16 ? 2 : 4;
        NB_BLOCK(b)
        for (int l = 0; l < 8; l++) {
            kdots(qp, a, b * bs + step * l, step, zs, d);
            for (int j = 0; j < 16; j++) X[l][j] = fmaf((float)d[j], s[j], X[l][j]);
        }
    }
#undef NB_BLOCK
    for (int l = 0; l < 16; l++) {
        if (n0 + l < n4) {
            y[l] = (((X[0][l] + X[1][l]) + X[2][l]) + X[3][l]) + (((X[4][l] + X[5][l]) + X[6][l]) + X[7][l]);
        } else {
            y[l] = ((X[4][l] + X[0][l]) + (X[6][l] + X[2][l])) + ((X[5][l] + X[1][l]) + (X[7][l] + X[3][l]));
        }
    }
    float *out = c->y + (size_t)m * N + n0;
    const int ncols = N - n0 < 16 ? N - n0 : 16;
    for (int l = 0; l < ncols; l++) {
        float v = c->bias ? y[l] + c->bias[n0 + l] : y[l];
        if (!m1) {
            float z = 0.f;
            for (int b = 0; b < kb; b++) {
                const float sb = sp[(size_t)b * 16 + l];
                const float zz = w->zp_kind == NB_ZP_NONE ? sb : sb * nb_zp(w, p, b, l);
                z = fmaf(-ablk[b], zz, z);
            }
            v = v + z;
        }
        out[l] = v;
    }
}

/* NB_MODE_I8_FAST (nbits.h): per output one fma chain over the blocks of the exact int32 dots of (q - zp) and
 * the int8 A */
static void i8_row_fast(const nb_call *c, int m, int p)
{
    const nb_weights *w = &c->w;
    const int cpb = w->bs / 8, N = w->N, ncols = N - 16 * p < 16 ? N - 16 * p : 16;
    const uint8_t *qp = w->qw + (size_t)p * w->kc * 64;
    const float *sp = w->sc + (size_t)p * w->kb * 16;
    const int8_t *a = c->aq + (size_t)m * c->kpad;
    const float *sa = c->ascale + (size_t)m * w->kb, *S = c->asum + (size_t)m * w->kb;
    float acc[16] = {0};
    for (int b = 0; b < w->kb; b++) {
        int32_t d[16] = {0};
        for (int ci = 0; ci < cpb; ci++) {
            uint32_t words[16];
            memcpy(words, qp + ((size_t)b * cpb + ci) * 64, 64);
            const int8_t *ak = a + (size_t)b * w->bs + 8 * ci;
            for (int l = 0; l < 16; l++)
                for (int j = 0; j < 8; j++) d[l] += nb_q(words[l], j) * ak[j];
        }
        for (int l = 0; l < 16; l++) {
            const int32_t D = d[l] - (int32_t)nb_zp(w, p, b, l) * (int32_t)S[b];
            const float s = sa[b] * sp[(size_t)b * 16 + l];
            acc[l] = fmaf((float)D, s, acc[l]);
        }
    }
    float *y = c->y + (size_t)m * N + 16 * p;
    for (int l = 0; l < ncols; l++) y[l] = c->bias ? acc[l] + c->bias[16 * p + l] : acc[l];
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
            if (c->mode == NB_MODE_I8_FAST) {
                i8_row_fast(c, m, p);
                continue;
            }
            if (c->mode >= NB_MODE_I8_AVX2) {
                i8_row_avx2(c, m, p);
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
    if (NB_MLAS_AVX2(mode)) n = ((n + 63) & ~(size_t)63) + kpad + kpad / 2; /* aqs, aqc */
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
    c->aqs = NULL;
    c->aqc = NULL;
    if (NB_MLAS_AVX2(c->mode)) {
        const size_t n = (rows * kb * 8 + rows * kpad + 63) & ~(size_t)63;
        c->aqs = (int32_t *)(p + n);
        c->aqc = c->aqs + kpad / 4;
    }
}
