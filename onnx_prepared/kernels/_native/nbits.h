/* MatMulNBits (4-bit) kernels: the packed layout, the call descriptor and the per-ISA entry points.
 *
 * Packed layout "panel16 v2" (ISA-independent; one byte buffer, sections in this order):
 *   qw     uint8 [P][KC][16][4]: panel p = output columns 16p..16p+15, chunk c = k values 8c..8c+7.
 *          Byte i (0..3) of (column l, chunk c) holds q[k = 8c + i][n = 16p + l] in its low nibble and
 *          q[8c + i + 4][n] in its high nibble: the low nibbles of a 32-bit word are k values 0-3 of the
 *          chunk, the high nibbles 4-7, so one vpdpbusd of either against 4 consecutive int8 values of A
 *          is the sum of one aligned quad of k values (the unit of onnxruntime's int8 accumulation).
 *          NB_KPOS(j) is the nibble index (0..7, bits 4*NB_KPOS(j)) of the chunk's k value j.
 *   scales float [P][KB][16]
 *   zp     none (symmetric, zero point 8) | uint8 [P][KB][8] nibbles (byte i: column 2i low, 2i+1 high)
 *          | float [P][KB][16]
 * P = ceil(N/16), KB = ceil(K/bs), KC = KB*bs/8. Columns past N and k past K hold q = 0, scale 0.
 *
 * A call computes y[m][n] for rows m of A; A is first "prepared" into scratch (phase 1: per row,
 * zero-padded to KB*bs), then the panels are multiplied (phase 2). Both phases split over the pool.
 *
 * int8 (accuracy_level 4) follows onnxruntime 1.32's MLAS CompInt8 path on AVX512-VNNI (SQ4BitGemmKernel_
 * BlkSum_CompInt8) bit for bit at block size 32 (the block size of every model the benchmarks use):
 *   A per block: sa = amax / 127, qa = round_half_even(a * (127 / amax)), ablk = sa * (float)sum(qa);
 *   per output (m, n), with P_q(b) the int32 dot of quad q (k 4q..4q+3) of block b, s_b = sb * sa:
 *     16 float chains F[j], one fma each per group of 4 blocks (blocks 4g + beta, beta = 0..3):
 *       F[(beta&1)*8 + (beta>>1)*2 + 4i + h] = fma(P_{4i+h} + P_{4i+h+2}, s_b, .)   (i, h in {0, 1})
 *     G[l] = F[l] + F[l + 8]; each trailing block (KB % 4 of them) adds G[l] = fma(P_l, s_b, G[l]);
 *     y = ((G0+G1)+G2)+G3 + (((G4+G5)+G6)+G7)  (columns below N & ~3; the last N % 4 columns sum
 *     ((G4+G0)+(G6+G2)) + ((G5+G1)+(G7+G3)) instead), then y + bias;
 *     the zero-point term separately: z = 0, z = fma(ablk_b, -(sb * zp), z) over b in order; y + z.
 *   Other block sizes (same A quantization, bias and zero-point term; 16 chains F[j], verified bit for bit):
 *     16: groups of 8 blocks, block beta feeds F[4(beta&3) + (beta<4 ? 0 : 2) + u] = fma(P_u + P_{u+2}, .),
 *         u in {0, 1}; G[l] = F[l] + F[l+8]; each trailing block adds k pairs (2l, 2l+1) to G[l]; sums as 32;
 *     64: pairs of blocks, block beta feeds F[4L + beta] (P_{4L} + P_{4L+2}) and F[4L + beta + 2]
 *         (P_{4L+1} + P_{4L+3}); an odd last block adds P_j to F[j];
 *     128, 256: per 128 k values F[j] = fma(P_j + P_{16+j}, s_b, F[j]);
 *     64-256 sum h[j] = F[j] + F[j+8], t[i] = h[4+i] + h[i], y = (t0+t2) + (t1+t3), except the last row of
 *     an odd M (onnxruntime's 1-row kernel) in its first N & ~3 columns: S_L = ((F4L+F4L+1)+F4L+2)+F4L+3,
 *     y = (S0+S2) + (S1+S3).
 *   Every dispatch level implements every block size in this order (NB_MODE_I8).
 *
 * int8 in the order of MLAS's AVX2 kernels (NB_MODE_I8_AVX2, what onnxruntime runs on a CPU without AVX-512;
 * NB_MODE_I8_AVX2VNNI with AVX-VNNI), same A quantization, verified bit for bit at block sizes 16-256:
 *   8 float chains X[l] per output. k is cut into groups of 64 (two blocks of 32, four of 16, or a 64-k
 *   slice of a larger block); in each group chain l gets one fma of the int32 dot of the 8 k values of
 *   chunk NB_LC[l] of the group (NB_LC = 0 1 4 5 2 3 6 7) times sa * sb of the chunk's block. AVX-VNNI at
 *   blocks >= 64 (not the one-row kernel): chain l gets k quads l and l + 8 of the group instead.
 *   Trailing blocks (after the last whole group): chain l gets the quad l (block 32) or the k pair l
 *   (block 16) of each. The dot is of the unsigned q; y = fold(X) + bias, then + the zero-point term as
 *   above. fold: ((X0+X1)+X2)+X3 + (((X4+X5)+X6)+X7), the last N % 4 columns ((X4+X0)+(X6+X2)) +
 *   ((X5+X1)+(X7+X3)).
 *   The one-row kernel (NB_M1ROW: M = 1, or the last row when M % 128 == 1) dots q - zero_point instead
 *   (the integer correction from the quad sums aqs), has no separate zero-point term, and at block 32 with
 *   packed zero points gives chain l the quad l of every block.
 *
 * int8 in our own order (NB_MODE_I8_FAST, opt-in: not onnxruntime's bits, within float rounding of them per
 * call, but whole models drift from onnxruntime with it, matmul_nbits.int8_order), same A quantization; one
 * float chain per output over the blocks:
 *   D_b = sum over the block's k of (q - zero_point) * qa, exact in int32 (|D_b| < 2^20), so (float)D_b is
 *   exact; acc = 0, acc = fma((float)D_b, sa_b * sb_b, acc) for b = 0, 1, ... (the product rounded to float
 *   first); y = acc + bias. asum holds (float)sum(qa) of each block (exact) instead of ablk.
 *   Every implementation gives the same bits: the int32 dots are exact whatever their order (the AVX2 one
 *   sums vpmaddubsw pairs in int16 across 32 k values, |pair| <= 2 * 15 * 127, eight pairs <= 30480, then
 *   one vpmaddwd per 32 k), and D_b as float is cvt(dot) - zero_point * sum(qa), exact in one fnmadd.
 *   Every dispatch level implements it (AVX-512 VNNI through the AVX2 kernels).
 *
 * fp32 (accuracy_level 0-3) by int8 digits (NB_MODE_F32_DIGITS, internal: chosen by module.c for M up to the
 * ISA's f32_digits_upto (3: from 4 rows the fp32 kernels give onnxruntime's bits), weights without float zero
 * points, never asked for by a caller): each block of A is written as three int8 digits, a = s3 * (16384 d1 + 128 d2 + d3) + r with s3 = (amax / 127) / 16384 and
 * |r| <= s3 / 2 (~2.4e-7 amax: the rounding of an fp32 product is ~6e-8 of it), so the weights' nibbles meet A
 * in vpdpbusd (exact int32: |sum (q - zp) (16384 d1 + 128 d2 + d3)| < 2^30 per block of 32) instead of one
 * nibble-to-float conversion and fma per k value: y = sum_b fma((float)(X_b - zp Z_b), sb * s3_b, .) with X_b
 * the block's combined digit dot and Z_b the sum of its combined digits. Not fp32's rounding: within ~1.5e-6
 * of max|Y| of the exact product (the fp32 kernels ~6e-7; tests/kernels/test_matmul_nbits_digits.py). Block sizes 16 and 32 (the int32 bound). A row whose block maxima are not finite or below
 * 2^-100 (s3 would be subnormal) leaves the whole call on the fp32 kernels (nb_isa.digits_prep returns 0).
 */
#define NB_KPOS(j) (2 * ((j) & 3) + ((j) >> 2))

#ifndef ONNX_PREPARED_NBITS_H
#define ONNX_PREPARED_NBITS_H

#include <stddef.h>
#include <stdint.h>

enum { NB_ZP_NONE = 0, NB_ZP_U4 = 1, NB_ZP_F32 = 2 };
/* NB_MODE_I8*: accuracy_level 4 in the summation order of onnxruntime's MLAS on one kind of CPU: I8 its
 * AVX-512 kernels (above), I8_AVX2 its AVX2 kernels, I8_AVX2VNNI its AVX-VNNI ones (below); I8_FAST ours */
enum { NB_MODE_F32 = 0, NB_MODE_I8 = 1, NB_MODE_I8_AVX2 = 2, NB_MODE_I8_AVX2VNNI = 3, NB_MODE_I8_FAST = 4,
       NB_MODE_F32_DIGITS = 5 /* internal (above) */ };
/* the modes in MLAS's AVX2 orders (they need the quad sums aqs, aqc of the last row) */
#define NB_MLAS_AVX2(mode) ((mode) == NB_MODE_I8_AVX2 || (mode) == NB_MODE_I8_AVX2VNNI)
/* the row MLAS's AVX2 path runs through its one-row kernel (a 128-row tile of one row; blocks >= 32) */
#define NB_M1ROW(c, m) ((c)->w.bs >= 32 && (c)->M % 128 == 1 && (m) == (c)->M - 1)

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
     * NB_MODE_I8*: aq [M][kpad] (row-major, k in order), ascale [M][kb] (sa), asum [M][kb] = ablk
     * (sa * sum of the block's int8 values), times 8 for symmetric weights (exact: then
     * ablk * (8 sb) = asum * sb, the zero-point term's product); NB_MODE_I8_FAST: asum = the sum itself;
     * NB_MODE_F32_DIGITS: aq [M][3][kpad] (digits d1, d2, d3), ascale [M][kb] = s3, asum [M][kb] holds the
     * int32 Z_b (its bits) */
    float *af;
    int8_t *aq;
    float *ascale;
    float *asum;
    int32_t *aqs; /* NB_MODE_I8_AVX2*: sums of the int8 quads (k 4i..4i+3) of row M - 1, [kpad / 4] */
    int32_t *aqc; /* and 8 x the sums of its chunks (k 8i..8i+7), [kpad / 8] (symmetric weights' correction) */
} nb_call;

typedef struct {
    const char *name;
    void (*prep)(const nb_call *c, int m0, int m1);
    void (*gemm)(const nb_call *c, int m0, int m1, int p0, int p1);
    int f32_tiles_from; /* from this M on, fp32 A is copied into row tiles (0: never; else A may be read in place) */
    int i8_rows;        /* rows of a gemm task in NB_MODE_I8 (0: 32, as every mode) */
    int f32_digits_upto; /* NB_MODE_F32_DIGITS for M up to this (0: never) */
    int (*digits_prep)(const nb_call *c, int m0, int m1); /* its phase 1; 0: some block cannot be written so */
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
