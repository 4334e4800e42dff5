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

/* int8 A is written in tiles of th rows (th = 1: row-major): tile t (rows th*t ...) starts at
 * aq + th*t * kpad, chunk g (8 k values) at +8*th*g, row r's 8 bytes at +8r; ascale and acorr of the tile
 * at +th*t * kb as [block][th] (asum stays row-major). nbits_avx512vnni.c and nbits_avx2.inc read th = 4. */
static void nb_prep_rows_th(const nb_call *c, int m0, int m1, int th)
{
    const int K = c->w.K, bs = c->w.bs, kb = c->w.kb, kpad = c->kpad;
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
        const int tr = m % th, mt = m - tr;
        int8_t *aq = c->aq + (size_t)mt * kpad + 8 * tr;
        float *ascale = c->ascale + (size_t)mt * kb + tr, *acorr = c->acorr + (size_t)mt * kb + tr;
        for (int b = 0; b < kb; b++) {
            const int k0 = b * bs, n = (K - k0 < bs) ? K - k0 : bs;
            float amax = 0.f;
            for (int k = 0; k < n; k++) {
                float v = fabsf(a[k0 + k]);
                amax = v > amax ? v : amax;
            }
            const float inv = amax != 0.f ? 127.f / amax : 0.f;
            const float sc = amax / 127.f;
            ascale[b * th] = sc;
            int8_t tmp[256];
            int sum = 0;
            for (int k = 0; k < n; k++) {
                int q = (int)rintf(a[k0 + k] * inv);
                tmp[k] = (int8_t)q;
                sum += q;
            }
            for (int k = n; k < bs; k++) tmp[k] = 0;
            asum[b] = (float)sum;
            acorr[b * th] = (float)sum * sc * (c->w.zp_kind == NB_ZP_NONE ? 8.f : 1.f);
            for (int g = 0; g < bs; g += 8) {
                int8_t *dst = aq + (size_t)((k0 + g) / 8) * 8 * th;
                for (int i = 0; i < 4; i++) {
                    dst[i] = tmp[g + 2 * i];
                    dst[4 + i] = tmp[g + 2 * i + 1];
                }
            }
        }
    }
}

static void nb_prep_rows(const nb_call *c, int m0, int m1)
{
    nb_prep_rows_th(c, m0, m1, 1);
}

#endif
