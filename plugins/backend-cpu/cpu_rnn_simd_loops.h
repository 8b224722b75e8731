/*
 * cpu_rnn_simd_loops.h — the f32 cell kernels of cpu_rnn_simd.c for one vector width,
 * included once per instruction set with these defined: V (the vector type), M (its lane
 * mask type), W (lanes), FN(name) (the name with its ISA suffix), ATTR (the function target
 * attribute), MASK(left) (the first min(left, W) lanes), LDF/STF (full loads and stores),
 * LDM/STM (masked: LDM(p, m), STM(p, m, v)), ADD, SUB, MUL, DIV, SET1, ZERO, VEXP, VTANH
 * (libmvec's vector expf/tanhf of that width), STNT(p, v) (a non-temporal store to an
 * address aligned to the vector's size), FENCE() (the store fence after them); it undefines
 * them at its end.
 *
 * Each row is walked in chunks of W lanes by one inlined chunk function called with full
 * (plain loads and stores) for every whole chunk and once masked for the row's tail, so the
 * common H (a multiple of W) never pays a masked access (an AVX2 masked store is slow on
 * some cores).
 */

#define LD(p) (full ? LDF(p) : LDM((p), m))
#define ST(p, v) (full ? STF((p), (v)) : STM((p), m, (v)))

ATTR static inline V FN(sig)(V v) {
    const V one = SET1(1.0f);
    return DIV(one, ADD(one, VEXP(SUB(ZERO(), v))));
}

ATTR static inline void FN(lstm_chunk)(float *gr, const float *xr, const float *hr,
                                       const float *bias, float *c, const float *hin,
                                       float *hout, float *y, int64_t H, int64_t j, M m,
                                       bool full, bool stream) {
#define PRE(q) \
    ADD(ADD(LD(xr + (q) * H + j), LD(hr + (q) * H + j)), bias ? LD(bias + (q) * H + j) : ZERO())
    V ig = FN(sig)(PRE(0)), fg = FN(sig)(PRE(1)), gg = VTANH(PRE(2)), og = FN(sig)(PRE(3));
#undef PRE
    V cp = LD(c + j), hp = LD(hin + j);
    V cn = ADD(MUL(fg, cp), MUL(ig, gg));
    V hn = MUL(og, VTANH(cn));
    if (stream) {
        STNT(gr + j, ig), STNT(gr + H + j, fg), STNT(gr + 2 * H + j, gg);
        STNT(gr + 3 * H + j, og), STNT(gr + 4 * H + j, cp), STNT(gr + 5 * H + j, hp);
    } else {
        ST(gr + j, ig), ST(gr + H + j, fg), ST(gr + 2 * H + j, gg), ST(gr + 3 * H + j, og);
        ST(gr + 4 * H + j, cp), ST(gr + 5 * H + j, hp);
    }
    ST(c + j, cn), ST(hout + j, hn), ST(y + j, hn);
}

/* The hidden units [j0, j1) of the row (j0 a multiple of W; the whole row is 0, H): the
 * previous hidden state is read from hin and the new one written to hout (the same row, or
 * the other of two buffers when other threads still read the previous state).
 * The workspace row gr is next read by the backward, after the rest of the forward (8 MiB
 * and more of it in train_lstm_h256, 6H floats a row): non-temporal stores skip reading its
 * lines into the cache first and evicting what the steps use, where the row is aligned to the
 * vector and H a multiple of it (so every chunk is). */
ATTR static void FN(lstm_cell)(float *gr, const float *xr, const float *hr, const float *bias,
                               float *c, const float *hin, float *hout, float *y, int64_t H,
                               int64_t j0, int64_t j1) {
    int64_t j = j0;
    bool stream = H % W == 0 && (uintptr_t)gr % (W * sizeof(float)) == 0;
    for (; j + W <= j1; j += W)
        FN(lstm_chunk)(gr, xr, hr, bias, c, hin, hout, y, H, j, MASK(W), true, stream);
    if (j < j1)
        FN(lstm_chunk)(gr, xr, hr, bias, c, hin, hout, y, H, j, MASK(j1 - j), false, false);
    if (stream) FENCE(); /* before another thread or kernel reads the row */
}

ATTR static inline void FN(lstm_bwd_chunk)(const float *gr, const float *gy, float *dh,
                                           float *dc, float *d, int64_t H, int64_t j, M m,
                                           bool full) {
    const V one = SET1(1.0f);
    V ig = LD(gr + j), fg = LD(gr + H + j), gg = LD(gr + 2 * H + j), og = LD(gr + 3 * H + j),
      cp = LD(gr + 4 * H + j);
    V tc = VTANH(ADD(MUL(fg, cp), MUL(ig, gg)));
    V dht = LD(dh + j);
    if (gy) dht = ADD(dht, LD(gy + j));
    V dct = ADD(LD(dc + j), MUL(MUL(dht, og), SUB(one, MUL(tc, tc))));
    ST(d + j, MUL(MUL(MUL(dct, gg), ig), SUB(one, ig)));
    ST(d + H + j, MUL(MUL(MUL(dct, cp), fg), SUB(one, fg)));
    ST(d + 2 * H + j, MUL(MUL(dct, ig), SUB(one, MUL(gg, gg))));
    ST(d + 3 * H + j, MUL(MUL(MUL(dht, tc), og), SUB(one, og)));
    ST(dc + j, MUL(dct, fg));
    ST(dh + j, ZERO());
}

/* The hidden units [j0, j1) of the row (j0 a multiple of W). */
ATTR static void FN(lstm_cell_bwd)(const float *gr, const float *gy, float *dh, float *dc,
                                   float *d, int64_t H, int64_t j0, int64_t j1) {
    int64_t j = j0;
    for (; j + W <= j1; j += W) FN(lstm_bwd_chunk)(gr, gy, dh, dc, d, H, j, MASK(W), true);
    if (j < j1) FN(lstm_bwd_chunk)(gr, gy, dh, dc, d, H, j, MASK(j1 - j), false);
}

ATTR static inline void FN(gru_chunk)(float *gr, const float *hr, float *h, float *y,
                                      int64_t H, int64_t j, M m, bool full) {
    const V one = SET1(1.0f);
    V r = FN(sig)(ADD(LD(gr + j), LD(hr + j)));
    V z = FN(sig)(ADD(LD(gr + H + j), LD(hr + H + j)));
    V nl = LD(hr + 2 * H + j), hp = LD(h + j);
    V n = VTANH(ADD(LD(gr + 2 * H + j), MUL(r, nl)));
    V hn = ADD(MUL(SUB(one, z), n), MUL(z, hp));
    ST(gr + j, r), ST(gr + H + j, z), ST(gr + 2 * H + j, n), ST(gr + 3 * H + j, nl);
    ST(gr + 4 * H + j, hp);
    ST(h + j, hn), ST(y + j, hn);
}

ATTR static void FN(gru_cell)(float *gr, const float *hr, float *h, float *y, int64_t H) {
    int64_t j = 0;
    for (; j + W <= H; j += W) FN(gru_chunk)(gr, hr, h, y, H, j, MASK(W), true);
    if (j < H) FN(gru_chunk)(gr, hr, h, y, H, j, MASK(H - j), false);
}

#undef LD
#undef ST
/* the includer's parameters, so that the next variant can define its own */
#undef V
#undef M
#undef W
#undef FN
#undef ATTR
#undef MASK
#undef LDF
#undef STF
#undef LDM
#undef STM
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef SET1
#undef ZERO
#undef VEXP
#undef VTANH
#undef STNT
#undef FENCE
