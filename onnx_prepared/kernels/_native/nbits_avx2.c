/* AVX2 + FMA kernels (no VNNI). */
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx2,fma")
#endif
#define NB_AVXVNNI 0
#include "nbits_avx2.inc"

const nb_isa nb_isa_avx2 = {"avx2", prep_avx2, gemm_avx2};

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
