/*
 * kernels_isa.h: private plumbing between kernels.c (dispatch) and the
 * per-ISA kernel files. Each fill function overwrites the entries its ISA
 * implements and leaves the others as they are, so a tier starts from the
 * tier below it (avx512vnni from avx2, neon-dotprod from neon).
 */
#ifndef TG_CPU_KERNELS_ISA_H
#define TG_CPU_KERNELS_ISA_H

#include "kernels.h"

#if defined(__x86_64__)
void tg_cpu_fill_avx2(tg_cpu_kernels *k);      /* kernels_avx2.c */
void tg_cpu_fill_avx512(tg_cpu_kernels *k);    /* kernels_avx512.c */
#endif
#if defined(__aarch64__)
void tg_cpu_fill_neon(tg_cpu_kernels *k);      /* kernels_neon.c */
void tg_cpu_fill_neon_dotprod(tg_cpu_kernels *k);
#endif

#endif
