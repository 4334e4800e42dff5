/* MatMulNBits (4-bit) kernels: the packed layout, the call descriptor and the per-ISA entry points.
 *
 * Packed layout "panel16 v1" (ISA-independent; one byte buffer, sections in this order):
 *   qw     uint8 [P][KC][16][4]: panel p = output columns 16p..16p+15, chunk c = k values 8c..8c+7.
 *          The 4 bytes of (column l, chunk c) are a little-endian uint32 whose nibble j (bits 4j..4j+3)
 *          is q[k = 8c + j][n = 16p + l] (these are exactly the 4 source bytes of that column).
 *   scales float [P][KB][16]
 *   zp     none (symmetric, zero point 8) | uint8 [P][KB][8] nibbles (byte i: column 2i low, 2i+1 high)
 *          | float [P][KB][16]
 * P = ceil(N/16), KB = ceil(K/bs), KC = KB*bs/8. Columns past N and k past K hold q = 0, scale 0.
 *
 * A call computes y[m][n] for rows m of A; A is first "prepared" into scratch (phase 1: per row,
 * zero-padded to KB*bs), then the panels are multiplied (phase 2). Both phases split over the pool.
 */
#ifndef ONNX_PREPARED_NBITS_H
#define ONNX_PREPARED_NBITS_H

#include <stddef.h>
#include <stdint.h>

enum { NB_ZP_NONE = 0, NB_ZP_U4 = 1, NB_ZP_F32 = 2 };
enum { NB_MODE_F32 = 0, NB_MODE_I8 = 1 };

typedef struct {
    int K, N, bs, kb, kc, P, zp_kind;
    const uint8_t *qw;
    const float *sc;
    const uint8_t *zpn; /* NB_ZP_U4 */
    const float *zpf;   /* NB_ZP_F32 */
} nb_weights;

typedef struct {
    nb_weights w;
    int M, mode, kpad;
    const float *a; /* [M][K] */
    float *y;       /* [M][N] */
    const float *bias;
    /* prepared A (scratch): NB_MODE_F32: af [M][kpad], asum [M][kb] (sum of a over the block)
     * NB_MODE_I8: aq [M][kpad] (each 8-group stored as k0 k2 k4 k6 k1 k3 k5 k7), ascale [M][kb],
     * asum [M][kb] (sum of the int8 values, as float), acorr [M][kb] = asum * ascale, times 8 for
     * symmetric weights (the zero-point term of a block, ready for one fused multiply-subtract) */
    float *af;
    int8_t *aq;
    float *ascale;
    float *asum;
    float *acorr;
} nb_call;

typedef struct {
    const char *name;
    void (*prep)(const nb_call *c, int m0, int m1);
    void (*gemm)(const nb_call *c, int m0, int m1, int p0, int p1);
    int f32_tiles_from; /* from this M on, fp32 A is copied into row tiles (0: never; else A may be read in place) */
} nb_isa;

extern const nb_isa nb_isa_portable;
#if defined(__x86_64__) || defined(_M_X64)
#define NB_X86 1
extern const nb_isa nb_isa_avx2;
extern const nb_isa nb_isa_avx2vnni;
extern const nb_isa nb_isa_avx512vnni;
#endif

size_t nb_scratch_bytes(int M, int K, int bs, int mode);
void nb_layout_scratch(nb_call *c, void *scratch);

#endif
