/*
 * onednn_isa.h — for tests that link oneDNN ($(DNNL_LIBS)): whether oneDNN's effective ISA
 * on this CPU is avx512_core (AVX-512 F, BW, VL, DQ) or above. Below it (an AVX2 CPU) its
 * bf16 primitives are reference ones, which the CPU plugin declines, and its f32 matmul is
 * gemm:jit, where the plugin copies a tall transposed A row-major first (cpu_matmul.c,
 * transpose_a). False in a build without oneDNN.
 */
#ifndef EMBER_TESTS_ONEDNN_ISA_H
#define EMBER_TESTS_ONEDNN_ISA_H

#include <stdbool.h>

#include "config.h" /* EM_HAVE_DNNL */

#ifdef EM_HAVE_DNNL
#include <dnnl.h>
#endif

static inline bool onednn_has_avx512_core(void) {
#ifdef EM_HAVE_DNNL
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core) ==
           (unsigned)dnnl_cpu_isa_avx512_core;
#else
    return false;
#endif
}

#endif
