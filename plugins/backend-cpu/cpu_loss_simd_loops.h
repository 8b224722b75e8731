/*
 * cpu_loss_simd_loops.h — cross_entropy's f32 row loops (cpu_loss.c) for one vector width,
 * included once per instruction set with these defined: V (the float vector type), VD (the
 * double vector of half as many lanes), W (lanes of V), FN(name) (the name with its ISA
 * suffix), ATTR (the function target attribute), LDU/STU (unaligned loads and stores), SET1,
 * SUB, MUL, MAX (on V), ZEROD, ADDD (on VD), CVT_LO/CVT_HI (V's low/high half widened to VD),
 * HMAX (V's largest lane, as float), HSUM_D (VD's lanes summed, as double: each ISA keeps its
 * own order), VEXP (libmvec's vector expf of that width); it undefines them at its end.
 */

/* logsumexp of the contiguous row x[0..C): the max in lanes, then exp(x - max) summed in
 * double (two accumulators, each lane in order, then across lanes), the tail scalar. */
ATTR static float FN(row_lse)(const float *x, int64_t C) {
    V mv = SET1(-INFINITY);
    int64_t c = 0;
    for (; c + W <= C; c += W) mv = MAX(mv, LDU(x + c));
    float m = HMAX(mv);
    for (int64_t i = c; i < C; i++) m = x[i] > m ? x[i] : m;
    V mw = SET1(m);
    VD s0 = ZEROD(), s1 = ZEROD();
    for (c = 0; c + W <= C; c += W) {
        V e = VEXP(SUB(LDU(x + c), mw));
        s0 = ADDD(s0, CVT_LO(e));
        s1 = ADDD(s1, CVT_HI(e));
    }
    double s = HSUM_D(ADDD(s0, s1));
    for (; c < C; c++) s += (double)expf(x[c] - m);
    return m + logf((float)s);
}

/* g[c] = exp(x[c] - lse) * a over the contiguous row x[0..C). */
ATTR static void FN(row_exp_scale)(float *g, const float *x, int64_t C, float lse, float a) {
    V lw = SET1(lse), aw = SET1(a);
    int64_t c = 0;
    for (; c + W <= C; c += W) STU(g + c, MUL(VEXP(SUB(LDU(x + c), lw)), aw));
    for (; c < C; c++) g[c] = expf(x[c] - lse) * a;
}

#undef V
#undef VD
#undef W
#undef FN
#undef ATTR
#undef LDU
#undef STU
#undef SET1
#undef SUB
#undef MUL
#undef MAX
#undef ZEROD
#undef ADDD
#undef CVT_LO
#undef CVT_HI
#undef HMAX
#undef HSUM_D
#undef VEXP
