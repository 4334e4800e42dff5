/* Phase 1 (prepare A), shared by every ISA file: each includes this header after its target pragma, so
 * the compiler vectorizes it for that ISA. The int8 quantization is bit-identical everywhere: max,
 * one division (127 / amax), one multiply and round-half-to-even are exact IEEE operations.
 * This mirrors onnxruntime's CompInt8 A quantization: per block of bs values, scale = amax / 127,
 * q = nearbyint(a * (127 / amax)), zero-padded past K. */
#ifndef ONNX_PREPARED_NBITS_PREP_H
#define ONNX_PREPARED_NBITS_PREP_H

#include <math.h>
#include <string.h>

#include "nbits.h"

/* Rows m0..m1 of A into the scratch of c (layout in nbits.h). */
static void nb_prep_rows(const nb_call *c, int m0, int m1)
{
    const int K = c->w.K, bs = c->w.bs, kb = c->w.kb, kpad = c->kpad;
    const float zmul = c->w.zp_kind == NB_ZP_NONE ? 8.f : 1.f;
    for (int m = m0; m < m1; m++) {
        const float *a = c->a + (size_t)m * K;
        float *asum = c->asum + (size_t)m * kb;
        if (c->mode == NB_MODE_F32) {
            float *af = c->af + (size_t)m * kpad;
            if (af != a) { /* module.c points af at A itself when K is a multiple of the block */
                memcpy(af, a, sizeof(float) * (size_t)K);
                memset(af + K, 0, sizeof(float) * (size_t)(kpad - K));
            }
            for (int b = 0; b < kb; b++) {
                float s = 0.f;
                for (int k = 0; k < bs; k++) s += af[b * bs + k];
                asum[b] = s;
            }
            continue;
        }
        int8_t *aq = c->aq + (size_t)m * kpad;
        float *ascale = c->ascale + (size_t)m * kb;
        for (int b = 0; b < kb; b++) {
            const int k0 = b * bs, n = (K - k0 < bs) ? K - k0 : bs;
            float amax = 0.f;
            for (int k = 0; k < n; k++) {
                float v = fabsf(a[k0 + k]);
                amax = v > amax ? v : amax;
            }
            const float inv = amax != 0.f ? 127.f / amax : 0.f;
            const float sc = amax / 127.f;
            ascale[b] = sc;
            int sum = 0;
            for (int k = 0; k < n; k++) {
                int q = (int)rintf(a[k0 + k] * inv);
                aq[k0 + k] = (int8_t)q;
                sum += q;
            }
            for (int k = n; k < bs; k++) aq[k0 + k] = 0;
            asum[b] = c->mode == NB_MODE_I8_FAST ? (float)sum : sc * (float)sum * zmul;
        }
        if (NB_MLAS_AVX2(c->mode) && m == c->M - 1) {
            for (int i = 0; i < kpad / 4; i++) c->aqs[i] = aq[4 * i] + aq[4 * i + 1] + aq[4 * i + 2] + aq[4 * i + 3];
            for (int i = 0; i < kpad / 8; i++) c->aqc[i] = 8 * (c->aqs[2 * i] + c->aqs[2 * i + 1]);
        }
    }
}

#endif
