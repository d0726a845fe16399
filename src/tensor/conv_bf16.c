/* Our own bf16 kernels for 3x3, stride-1, pad-1 convolutions on channels-last activations (the
 * body of a CIFAR ResNet), with AVX512-BF16's dot product (vdpbf16ps, which adds the products of
 * adjacent bf16 pairs into f32 lanes): backward-weights, and a direct kernel for forward and
 * backward-data.
 *
 * Why: oneDNN 2.6's bf16 backward-weights for these shapes on avx512_core_bf16 (jit_bf16, no
 * alternative but ref) ran at 52-74 % of the bf16 dot-product peak (ONEDNN_VERBOSE over a
 * ResNet-56 amp_bf16 step; ~96 ms of ~320, the largest single item), its forward (brgconv) and
 * backward-data at 72-100 %; the ResNet's body convolutions are three quarters of its step.
 *
 * BACKWARD-WEIGHTS.
 *
 * The problem: dW[oc][ic][kh][kw] = Σ_{n,oh,ow} dy[n,oh,ow,oc] · x[n, oh+kh-1, ow+kw-1, ic], a
 * GEMM with a long reduction (all pixels) and a small output (Cout x Cin·9). The reduction is
 * taken two pixels at a time (output columns ow, ow+1), and both operands need those pairs
 * adjacent:
 *   x pairs (x[.., q-1, ic], x[.., q, ic]) for 16 input channels (the lanes): interleaved in
 *     registers from two loads of the NHWC row (vpermt2w; 0 outside the image);
 *   DYI[n][oh][pw][oc] = (dy[.., 2pw, oc], dy[.., 2pw+1, oc]): one 32-bit pair, broadcast; packed
 *     per chunk of images (about 1024 pixels: it stays in L2) from bf16 or f32 (rounded to
 *     nearest even, as oneDNN's reorder rounds) storage, while the next chunk's x and dy are
 *     prefetched.
 * so the x pair for output columns (2pw, 2pw+1) and tap kw is (x[2pw + kw - 1], x[2pw + kw]). A
 * register tile of 24 accumulators — 16 input channels × 8 output channels × the 3 taps kw of
 * one kh — runs over the whole chunk: per output pair 2 loads, 2 interleaves and 8 broadcasts
 * feed 24 dot products, and the accumulators are loaded and stored once per chunk. Threads take
 * whole chunks with private f32 accumulators, added up at the end. (A packed copy of x as well,
 * XI, cost 10 % more on 16 channels at 32x32 and the same elsewhere.)
 *
 * DIRECT (forward; backward-data is the forward of dy with the weight transposed and its taps
 * mirrored). The reduction (input channels × taps) pairs adjacent input channels, which NHWC
 * already stores adjacent: a 32-bit input pair is broadcast straight from the activation rows, no
 * packing, against a packed weight WP[kh][ci/2][co/16][kw][16][2] (built per call, tiny). A tile
 * is 8 or 16 pixels of one output row × 2 or 1 blocks of 16 output channels (16 accumulators);
 * per input pair and tap it loads 1-2 weight vectors and broadcasts 8-16 input pairs (a broadcast
 * per vdpbf16ps costs nothing on Zen 4: a microbenchmark ran 1:1 and 1:3 at the same peak). The
 * padding columns' products are left out by tile variants specialised for the edges, rows
 * outside the image by skipping the tap row. The result is stored per pixel as 16 f32 or bf16
 * values — the NHWC output as it is.
 *
 * WINOGRAD F(2x2, 3x3) for forward and backward-data (below): 2.25x fewer products, with input and
 * output transforms in f32 around 16 small GEMMs on vdpbf16ps; the transformed operands are
 * rounded to bf16. Used where cmi_conv_get_algo() allows (auto: 32 or more channels each way).
 * Measured (2 threads, cmi_conv_fwd_bf16 on N 128, bf16 x in cache, bf16 y; ms, direct / Winograd):
 * 32->32 16x16 1.26 / 1.07, 64->64 8x8 1.14 / 0.86-0.90; 16->16 32x32 1.33 / 1.42 in one run and
 * 1.25 / 1.15 in another (one thread 2.64 / 2.16), and in the ResNet-56 amp_bf16 step Winograd on
 * the 16-channel convolutions too was slower (504-532 against 537-543 img/s): their GEMMs are only
 * 8 pair steps deep and the transforms a larger share. In that step (perf, 30 steps) the 32- and
 * 64-channel forward + backward-data samples went down 9 % and 27 %.
 *
 * Measured (bench/conv_bf16: N 128, bf16 x and dy not in cache, f32 weights, 2 threads, AMD EPYC
 * Zen 4 whose measured bf16 dot-product peak is ~473 GFLOP/s; quiet machine, 2026-11-26), own
 * against oneDNN 2.6 ms:
 *   16->16 32x32: forward 1.38 / 1.77, backward-data 1.46 / 1.61, backward-weights 1.74 / 2.50
 *   32->32 16x16: forward 1.28 / 1.55, backward-data 1.33 / 1.36, backward-weights 1.66 / 2.29
 *   64->64 8x8:   forward 1.21 / 1.40, backward-data 1.25 / 1.44, backward-weights 1.63 / 2.66
 */
#include "tensor/conv_bf16.h"

#include <omp.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CM_CONV_BF16_X86 1
#endif

bool cmi_conv_wgrad_bf16_fits(const cmi_conv_geom *g) {
#ifdef CM_CONV_BF16_X86
    static _Atomic int cpu = -1; /* every thread computes the same value */
    if (cpu < 0) {
        __builtin_cpu_init();
        cpu = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
    }
    return cpu && g->cl && g->groups == 1 && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->ph == 1 &&
           g->pw == 1 && g->dh == 1 && g->dw == 1 && g->OH == g->H && g->OW == g->W && g->W % 2 == 0 &&
           g->Cin % 16 == 0 && g->Cout % 16 == 0 && g->N > 0 && g->H > 0 && g->W > 0;
#else
    (void)g;
    return false;
#endif
}

#ifdef CM_CONV_BF16_X86
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* Word 2i takes a's word i, word 2i+1 b's word i (a and b in the low 256 bits of the operands). */
static const uint16_t k_interleave[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                          8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

/* 16 values from element i of a bf16 (f32 false) or f32 buffer, as bf16 (f32 rounded to nearest
 * even). */
TGT static inline __m256i ld16(const void *p, int64_t i, bool f32) {
    if (f32) return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)p + i));
    return _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
}

TGT static inline __m512i interleave(__m256i a, __m256i b, __m512i idx) {
    return _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), idx, _mm512_castsi256_si512(b));
}

/* DYI (see the top) for images [n0, n0 + nb). */
TGT static void pack_chunk(const cmi_conv_geom *g, const void *dy, bool dyf32, int64_t n0, int64_t nb, uint32_t *DYI) {
    const int64_t H = g->H, W = g->W, OC = g->Cout;
    const __m512i idx = _mm512_loadu_si512(k_interleave);
    for (int64_t r = 0; r < nb * H; r++) { /* image row (n0 + r / H, r % H) */
        const int64_t yrow = (n0 * H + r) * W * OC;
        uint32_t *yo = DYI + r * (W / 2) * OC;
        for (int64_t pw = 0; pw < W / 2; pw++)
            for (int64_t c = 0; c < OC; c += 16) {
                const __m256i a = ld16(dy, yrow + 2 * pw * OC + c, dyf32);
                const __m256i b = ld16(dy, yrow + (2 * pw + 1) * OC + c, dyf32);
                _mm512_storeu_si512(yo + pw * OC + c, interleave(a, b, idx));
            }
    }
}

/* Software prefetch of the next chunk's x and dy rows into L2, k cache lines per row of a tile,
 * while this chunk computes: packing a chunk otherwise waits on memory (x and dy were written
 * long before) with the dot-product units idle. */
typedef struct {
    const char *p[2], *end[2];
    int k;
} prefetcher;

TGT static inline void pf_step(prefetcher *pf) {
    for (int u = 0; u < pf->k; u++) {
        const int r = pf->p[0] < pf->end[0] ? 0 : 1;
        if (pf->p[r] >= pf->end[r]) return;
        _mm_prefetch(pf->p[r], _MM_HINT_T1);
        pf->p[r] += 64;
    }
}

/* One register tile over a chunk of nb images from n0: acc[(kh·3 + kw)·OC + oc][ic] for the 16
 * input channels [ic0, ic0 + 16) (the lanes), the 8 output channels [oc0, oc0 + 8) and kw 0..2 —
 * 24 accumulators. Per output pair: 2 loads of 16 input channels and 2 interleaves (vpermt2w,
 * free next to the dot products on Zen 4) give the three x pair vectors — the third is the next
 * pair's first —, 8 broadcasts of a dy pair from DYI each feed 3 dot products. (Two lane blocks
 * per tile — 6 vectors, 4 broadcasts, the same 24 accumulators — spilled registers and ran at
 * ~75 % of the peak against ~95 % for this one.) */
TGT static inline __attribute__((always_inline)) void tile(const cmi_conv_geom *g, const void *x, int64_t n0,
                                                           const uint32_t *DYI, int64_t nb, float *acc, int kh,
                                                           int64_t ic0, int64_t oc0, prefetcher *pf, const bool xf32) {
    const int64_t H = g->H, W = g->W, IC = g->Cin, OC = g->Cout;
    const __m512i idx = _mm512_loadu_si512(k_interleave);
    const __m256i zero = _mm256_setzero_si256();
    __m512 a[8][3];
#pragma GCC unroll 8
    for (int o = 0; o < 8; o++)
#pragma GCC unroll 3
        for (int kw = 0; kw < 3; kw++) a[o][kw] = _mm512_loadu_ps(acc + ((kh * 3 + kw) * OC + oc0 + o) * IC + ic0);
    /* output rows whose input row oh + kh - 1 is inside the image */
    const int64_t lo = kh == 0 ? 1 : 0, hi = kh == 2 ? H - 1 : H;
    for (int64_t n = 0; n < nb; n++)
        for (int64_t oh = lo; oh < hi; oh++) {
            pf_step(pf);
            const int64_t xr = ((n0 + n) * H + oh + kh - 1) * W * IC + ic0; /* element of x[.., ih, 0, ic0] */
            const uint32_t *dr = DYI + (n * H + oh) * (W / 2) * OC + oc0;
            __m256i p0 = ld16(x, xr, xf32);                                 /* x[2pw] */
            __m512bh v0 = (__m512bh)interleave(zero, p0, idx);              /* (x[2pw - 1], x[2pw]) */
            for (int64_t pw = 0; pw < W / 2; pw++) {
                const __m256i p1 = ld16(x, xr + (2 * pw + 1) * IC, xf32);
                const __m256i p2 = 2 * pw + 2 < W ? ld16(x, xr + (2 * pw + 2) * IC, xf32) : zero;
                const __m512bh v1 = (__m512bh)interleave(p0, p1, idx), v2 = (__m512bh)interleave(p1, p2, idx);
                const uint32_t *dq = dr + pw * OC;
#pragma GCC unroll 8
                for (int o = 0; o < 8; o++) {
                    const __m512bh b = (__m512bh)_mm512_set1_epi32((int)dq[o]);
                    a[o][0] = _mm512_dpbf16_ps(a[o][0], v0, b);
                    a[o][1] = _mm512_dpbf16_ps(a[o][1], v1, b);
                    a[o][2] = _mm512_dpbf16_ps(a[o][2], v2, b);
                }
                v0 = v2, p0 = p2;
            }
        }
#pragma GCC unroll 8
    for (int o = 0; o < 8; o++)
#pragma GCC unroll 3
        for (int kw = 0; kw < 3; kw++) _mm512_storeu_ps(acc + ((kh * 3 + kw) * OC + oc0 + o) * IC + ic0, a[o][kw]);
}

/* Every tile over one chunk (x stored bf16 or, xf32, f32). */
#define CM_WGRAD_CHUNK(NAME, XF32)                                                                                     \
    TGT static void NAME(const cmi_conv_geom *g, const void *x, int64_t n0, const uint32_t *DYI, int64_t nb,          \
                         float *acc, prefetcher *pf) {                                                                 \
        for (int kh = 0; kh < 3; kh++)                                                                                 \
            for (int64_t ic0 = 0; ic0 < g->Cin; ic0 += 16)                                                             \
                for (int64_t oc0 = 0; oc0 < g->Cout; oc0 += 8) tile(g, x, n0, DYI, nb, acc, kh, ic0, oc0, pf, XF32);    \
    }
CM_WGRAD_CHUNK(chunk_x16, false)
CM_WGRAD_CHUNK(chunk_x32, true)
#undef CM_WGRAD_CHUNK

/* Rows of tiles a chunk of nb images runs: (Cin / 16)·(Cout / 8) tiles for each kh, over
 * nb·(H - 1) rows for kh 0 and 2 and nb·H for kh 1. */
static int64_t row_iters(const cmi_conv_geom *g, int64_t nb) {
    const int64_t r = (g->Cin / 16) * (g->Cout / 8) * nb * (3 * g->H - 2);
    return r > 0 ? r : 1;
}
#endif

cm_status cmi_conv_wgrad_bf16(cm_tape *tp, const cmi_conv_geom *g, cm_dtype xs, const void *x, cm_dtype dys,
                              const void *dy, float *dW) {
#ifdef CM_CONV_BF16_X86
    if (!cmi_conv_wgrad_bf16_fits(g))
        return cmi_fail(tp, CM_ERR_INTERNAL, "conv2d: the bf16 backward-weights kernel was called on a problem it "
                                             "does not handle (N %lld, Cin %lld, Cout %lld, %lldx%lld)",
                        (long long)g->N, (long long)g->Cin, (long long)g->Cout, (long long)g->H, (long long)g->W);
    const int64_t H = g->H, W = g->W, IC = g->Cin, OC = g->Cout, N = g->N;
    /* about 1024 pixels a chunk: DYI, x's rows and the accumulators stay in L2 while every tile reads them */
    int64_t nb = (1024 + H * W - 1) / (H * W);
    if (nb > N) nb = N;
    const int64_t n_chunks = (N + nb - 1) / nb;
    int nth = cm_num_threads();
    if (nth > n_chunks) nth = (int)n_chunks;
    if (nth < 1) nth = 1;
    const size_t dyi_n = (size_t)(nb * H * (W / 2) * OC), acc_n = (size_t)(9 * IC * OC);
    const size_t mark = cm_arena_mark(tp->arena);
    uint32_t *DYI = cmi_scratch(tp, sizeof(uint32_t) * dyi_n * (size_t)nth);
    float *acc = cmi_scratch(tp, sizeof(float) * acc_n * (size_t)nth);
    if (!DYI || !acc) return cmi_status(tp);
    memset(acc, 0, sizeof(float) * acc_n * (size_t)nth);
    const bool xf32 = xs == CM_DTYPE_F32, dyf32 = dys == CM_DTYPE_F32;
#pragma omp parallel num_threads(nth)
    {
        const int t = omp_get_thread_num();
        uint32_t *dyi = DYI + dyi_n * (size_t)t;
        float *a = acc + acc_n * (size_t)t;
        const int64_t c0 = n_chunks * t / nth, c1 = n_chunks * (t + 1) / nth; /* this thread's chunks */
        for (int64_t ch = c0; ch < c1; ch++) {
            const int64_t n0 = ch * nb, m = n0 + nb <= N ? nb : N - n0;
            pack_chunk(g, dy, dyf32, n0, m, dyi);
            /* the next chunk's images [n1, n2), fetched over this chunk's rows of tiles */
            const int64_t n1 = n0 + m, n2 = ch + 1 < c1 ? (n1 + nb <= N ? n1 + nb : N) : n1;
            const int64_t px = H * W, xb = IC * (xf32 ? 4 : 2), yb = OC * (dyf32 ? 4 : 2);
            prefetcher pf = {{(const char *)x + n1 * px * xb, (const char *)dy + n1 * px * yb},
                             {(const char *)x + n2 * px * xb, (const char *)dy + n2 * px * yb},
                             (int)(((n2 - n1) * px * (xb + yb) / 64) / row_iters(g, m) + 1)};
            if (xf32) chunk_x32(g, x, n0, dyi, m, a, &pf);
            else chunk_x16(g, x, n0, dyi, m, a, &pf);
        }
    }
    /* dW (Cout, Cin, 3, 3) += the threads' acc[(kh·3 + kw)·OC + oc][ic], read along ic (contiguous;
     * the threads' order of the sum is kept) */
#pragma omp parallel for if (OC * IC >= 1024) schedule(static)
    for (int64_t oc = 0; oc < OC; oc++)
        for (int k = 0; k < 9; k++) {
            const float *a0 = acc + (size_t)((k * OC + oc) * IC);
            for (int64_t ic = 0; ic < IC; ic++) {
                float s = 0.0f;
                for (int t = 0; t < nth; t++) s += a0[acc_n * (size_t)t + (size_t)ic];
                dW[(oc * IC + ic) * 9 + k] += s;
            }
        }
    cm_arena_rewind(tp->arena, mark);
    return CM_OK;
#else
    (void)xs, (void)x, (void)dys, (void)dy, (void)dW;
    return cmi_fail(tp, CM_ERR_INTERNAL, "conv2d: the bf16 backward-weights kernel needs x86-64 (N %lld)",
                    (long long)g->N);
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* Forward and backward-data: one direct kernel                                                 */
/* ------------------------------------------------------------------------------------------ */

bool cmi_conv_direct_bf16_fits(const cmi_conv_geom *g) {
    const bool chans = (g->Cin == 16 || g->Cin == 32 || g->Cin == 64) && (g->Cout == 16 || g->Cout == 32 || g->Cout == 64);
    return chans && g->W % 8 == 0 && cmi_conv_wgrad_bf16_fits(g);
}

/* The Winograd kernel's tile rows per block: the fewest that divide the H/2 tile rows and whose
 * W/2-tile rows make a multiple of 16 tiles; 0 where there are none. */
static int64_t wino_rows(const cmi_conv_geom *g) {
    for (int64_t r = 1; r <= g->H / 2; r++)
        if ((g->H / 2) % r == 0 && (r * g->W / 2) % 16 == 0) return r;
    return 0;
}

bool cmi_conv_winograd_bf16_fits(const cmi_conv_geom *g) {
    if (!cmi_conv_direct_bf16_fits(g) || g->H % 2 != 0) return false;
    const int64_t r = wino_rows(g);
    return r > 0 && r * g->W / 2 <= 128;
}

#ifdef CM_CONV_BF16_X86
/* The direct problem: out (N, H, W, CO) = Σ over 3x3 taps and CI input channels of in (N, H, W, CI)
 * and the packed weight WP[kh][ci / 2][co / 16][kw][16][2] (pairs of input channels adjacent, as
 * vdpbf16ps adds them): forward is (x, w), backward-data (dy, w transposed and flipped). */
typedef struct {
    int64_t N, H, W, CO;
    const uint16_t *in, *WP;
    void *out;
    bool out_bf16, accumulate; /* accumulate: out (f32) += the result */
} direct_args;

/* The packed weight of the forward problem (flip false: WP from w[co][ci][kh][kw]) or of
 * backward-data (flip true: co is w's input channel, ci its output channel, taps mirrored), from
 * the bf16 values wb of w (Cout, Cin, 3, 3). */
static void pack_weights(const cmi_conv_geom *g, const uint16_t *wb, bool flip, uint16_t *WP) {
    const int64_t CI = flip ? g->Cout : g->Cin, CO = flip ? g->Cin : g->Cout;
    /* in WP's order; the 32 values of one (kh, ci pair, co block, kw) come from wb (Cout, Cin, 3, 3)
     * at fixed strides: forward w[co][ci][kh][kw], flipped w[ci][co][2-kh][2-kw] */
    const int64_t sl = flip ? 9 : 9 * CI, se = flip ? 9 * CO : 9; /* strides of co % 16 and ci % 2 */
#pragma omp parallel for collapse(2) if (CI * CO >= 1024) schedule(static)
    for (int64_t kh = 0; kh < 3; kh++)
        for (int64_t cp = 0; cp < CI / 2; cp++)
            for (int64_t cb = 0; cb < CO / 16; cb++)
                for (int64_t kw = 0; kw < 3; kw++) {
                    const int64_t co = cb * 16, ci = 2 * cp;
                    const uint16_t *src = wb + (flip ? ((ci * CO + co) * 3 + 2 - kh) * 3 + 2 - kw
                                                     : ((co * CI + ci) * 3 + kh) * 3 + kw);
                    uint16_t *dst = WP + ((((kh * (CI / 2) + cp) * (CO / 16) + cb) * 3 + kw) * 16) * 2;
                    for (int l = 0; l < 16; l++)
                        for (int e = 0; e < 2; e++) dst[2 * l + e] = src[l * sl + e * se];
                }
}

/* One tile: PX output pixels [ow0, ow0 + PX) of row (n, oh) × OCB blocks of 16 output channels
 * from oc0, PX·OCB accumulators. Per input-channel pair and tap: OCB weight vectors, PX
 * broadcasts of an input pair read straight from the NHWC rows (Zen 4 runs a broadcast per
 * vdpbf16ps at full rate), PX·OCB dot products. L / R: the tile touches the left / right edge
 * (the padding column's products are left out at compile time). */
TGT static inline __attribute__((always_inline)) void dtile(const direct_args *d, int64_t n, int64_t oh, int64_t ow0,
                                                            int64_t oc0, const int CI, const int PX, const int OCB,
                                                            const bool L, const bool R) {
    const int64_t H = d->H, W = d->W, CO = d->CO;
    __m512 a[16][2];
#pragma GCC unroll 16
    for (int p = 0; p < PX; p++)
#pragma GCC unroll 2
        for (int j = 0; j < OCB; j++) a[p][j] = _mm512_setzero_ps();
    for (int kh = 0; kh < 3; kh++) {
        const int64_t ih = oh + kh - 1;
        if (ih < 0 || ih >= H) continue;
        const uint32_t *xr = (const uint32_t *)(d->in + ((n * H + ih) * W + ow0) * CI);
        const uint16_t *wk = d->WP + (((int64_t)kh * (CI / 2)) * (CO / 16) + oc0 / 16) * 3 * 32;
        for (int icp = 0; icp < CI / 2; icp++, xr++, wk += (CO / 16) * 3 * 32) {
#pragma GCC unroll 3
            for (int kw = 0; kw < 3; kw++) {
                __m512bh wv[2];
#pragma GCC unroll 2
                for (int j = 0; j < OCB; j++) wv[j] = (__m512bh)_mm512_loadu_si512(wk + (j * 3 + kw) * 32);
#pragma GCC unroll 16
                for (int p = 0; p < PX; p++) {
                    if ((L && kw == 0 && p == 0) || (R && kw == 2 && p == PX - 1)) continue;
                    const __m512bh b = (__m512bh)_mm512_set1_epi32((int)xr[(p + kw - 1) * (CI / 2)]);
#pragma GCC unroll 2
                    for (int j = 0; j < OCB; j++) a[p][j] = _mm512_dpbf16_ps(a[p][j], wv[j], b);
                }
            }
        }
    }
    const int64_t o = ((n * H + oh) * W + ow0) * CO + oc0;
#pragma GCC unroll 16
    for (int p = 0; p < PX; p++)
#pragma GCC unroll 2
        for (int j = 0; j < OCB; j++) {
            if (d->out_bf16)
                _mm256_storeu_si256((__m256i *)((uint16_t *)d->out + o + p * CO + 16 * j),
                                    (__m256i)_mm512_cvtneps_pbh(a[p][j]));
            else {
                float *op = (float *)d->out + o + p * CO + 16 * j;
                _mm512_storeu_ps(op, d->accumulate ? _mm512_add_ps(_mm512_loadu_ps(op), a[p][j]) : a[p][j]);
            }
        }
}

/* One output row (n, oh): every tile, the edge ones specialised; the input row two below is
 * prefetched for the next output row. */
#define CM_DIRECT_ROW(CI, PX, OCB)                                                                                      \
    TGT static void drow_##CI##_##PX##_##OCB(const direct_args *d, int64_t n, int64_t oh) {                           \
        const int64_t W = d->W;                                                                                        \
        if (oh + 2 < d->H) {                                                                                           \
            const char *nx = (const char *)(d->in + ((n * d->H + oh + 2) * W) * (CI));                                  \
            for (int64_t b = 0; b < W * (CI) * 2; b += 64) _mm_prefetch(nx + b, _MM_HINT_T0);                          \
        }                                                                                                              \
        for (int64_t ow0 = 0; ow0 < W; ow0 += (PX))                                                                    \
            for (int64_t oc0 = 0; oc0 < d->CO; oc0 += 16 * (OCB)) {                                                    \
                const bool l = ow0 == 0, r = ow0 + (PX) == W;                                                          \
                if (l && r) dtile(d, n, oh, ow0, oc0, CI, PX, OCB, true, true);                                        \
                else if (l) dtile(d, n, oh, ow0, oc0, CI, PX, OCB, true, false);                                       \
                else if (r) dtile(d, n, oh, ow0, oc0, CI, PX, OCB, false, true);                                       \
                else dtile(d, n, oh, ow0, oc0, CI, PX, OCB, false, false);                                             \
            }                                                                                                          \
    }
CM_DIRECT_ROW(16, 16, 1)
CM_DIRECT_ROW(16, 8, 1)
CM_DIRECT_ROW(16, 8, 2)
CM_DIRECT_ROW(32, 16, 1)
CM_DIRECT_ROW(32, 8, 1)
CM_DIRECT_ROW(32, 8, 2)
CM_DIRECT_ROW(64, 16, 1)
CM_DIRECT_ROW(64, 8, 1)
CM_DIRECT_ROW(64, 8, 2)
#undef CM_DIRECT_ROW

typedef void (*drow_fn)(const direct_args *, int64_t, int64_t);

/* The direct problem over all rows, images split between the threads. Tiles: 8 pixels × 2 blocks
 * of 16 output channels where CO allows, else 16 pixels (W a multiple of 16) or 8 × 1 block. */
static void direct(const direct_args *d, int64_t CI) {
    const int ocb = d->CO % 32 == 0 ? 2 : 1, px = ocb == 2 || d->W % 16 != 0 ? 8 : 16;
    const int ci = CI == 16 ? 0 : CI == 32 ? 1 : 2, shape = ocb == 2 ? 2 : px == 8 ? 1 : 0;
    static const drow_fn fns[3][3] = {{drow_16_16_1, drow_16_8_1, drow_16_8_2},
                                      {drow_32_16_1, drow_32_8_1, drow_32_8_2},
                                      {drow_64_16_1, drow_64_8_1, drow_64_8_2}};
    const drow_fn fn = fns[ci][shape];
    const int64_t rows = d->N * d->H;
#pragma omp parallel for schedule(static) if (rows * d->W * CI * d->CO >= 65536)
    for (int64_t r = 0; r < rows; r++) fn(d, r / d->H, r % d->H);
}

/* ------------------------------------------------------------------------------------------ */
/* Forward and backward-data: Winograd F(2x2, 3x3)                                               */
/* ------------------------------------------------------------------------------------------ */

/* The same problem as the direct kernel's, by Winograd's minimal filtering (Lavin & Gray 2015):
 * each 2x2 block of output pixels ("tile") is Y = Aᵀ [Σ_ci U(co, ci) ⊙ V(ci)] A, with the input
 * patch d (4x4, from one row and column above-left of the tile, 0 outside the image) transformed
 * to V = Bᵀ d B and the 3x3 filter g to U = G g Gᵀ (16 values each, ξ = 4i + j):
 *   Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1],
 *   Aᵀ = [1 1 1 0; 0 1 -1 -1]
 * — 16 products per tile and channel pair instead of 36: 2.25x fewer multiplies. The 16 sums over
 * input channels are 16 small GEMMs (tiles x CI) · (CI x CO), on vdpbf16ps like the direct kernel:
 * V and U are rounded to bf16 (nearest even), products added in f32. V is computed in f32 from
 * the bf16 input (sums and differences of four bf16 values: exact unless their magnitudes differ
 * by more than 2^15) and rounded once; U from the f32 weight (an f32 master weight is not rounded before the
 * transform). The rounding of V and U is the algorithm's extra error over the direct kernel's
 * (whose inputs are exact bf16 values): test_conv bounds both against a double reference.
 *
 * Work: blocks of R tile rows of one image (T = R·W/2 tiles, a multiple of 16), statically split
 * over the threads; per block, in thread-local scratch: V[ξ][t][ci] (bf16, 16·T·CI), the 16
 * GEMMs into M[ξ][t][co] (f32) in register tiles of 8 tiles x 32 output channels (or 16 x 16),
 * and the output transform of M into the NHWC output (f32, added to with accumulate, or bf16). */

typedef struct {
    int64_t N, H, W, CI, CO, R, T; /* T = R·W/2 tiles per block */
    const uint16_t *in;
    const uint32_t *U; /* U[ξ][ci/2][co] (bf16 pairs of adjacent input channels) */
    void *out;
    bool out_bf16, accumulate;
    uint16_t *V; /* per thread: 16·T·CI */
    float *M;    /* per thread: 16·T·CO */
} wino_args;

/* U of the forward problem (flip false: g(co, ci) = w[co][ci]) or of backward-data (flip true:
 * co is w's input channel, ci its output channel, taps mirrored), from w (Cout, Cin, 3, 3) stored
 * as f32 or bf16, computed in f32 (G's halves are exact) and rounded to nearest even
 * (cmi_bf16_round16). 16 input channels at a time, in the lanes (the weight gathered). */
TGT static void wino_weights(const cmi_conv_geom *g, cm_dtype ws, const void *w, bool flip, uint16_t *U) {
    const int64_t CI = flip ? g->Cout : g->Cin, CO = flip ? g->Cin : g->Cout;
    const int64_t sci = flip ? CO * 9 : 9, sco = flip ? 9 : CI * 9; /* strides of ci and co in w */
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)sci));
    const __m512 half = _mm512_set1_ps(0.5f);
#pragma omp parallel for if (CI * CO >= 1024) schedule(static)
    for (int64_t co = 0; co < CO; co++)
        for (int64_t c0 = 0; c0 < CI; c0 += 16) {
            __m512 k[3][3], t[4][3];
            const int64_t base = co * sco + c0 * sci;
            for (int q = 0; q < 9; q++) {
                const int64_t o = base + (flip ? 8 - q : q);
                if (ws == CM_DTYPE_BF16) { /* (no 16-bit gather; a bf16 weight is the rare case) */
                    float kk[16];
                    for (int l = 0; l < 16; l++) kk[l] = cmi_bf16_to_f32(((const uint16_t *)w)[o + l * sci]);
                    k[q / 3][q % 3] = _mm512_loadu_ps(kk);
                } else
                    k[q / 3][q % 3] = _mm512_i32gather_ps(idx, (const float *)w + o, 4);
            }
            for (int c = 0; c < 3; c++) { /* t = G k */
                t[0][c] = k[0][c];
                t[1][c] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_add_ps(k[0][c], k[1][c]), k[2][c]));
                t[2][c] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(k[0][c], k[1][c]), k[2][c]));
                t[3][c] = k[2][c];
            }
            uint32_t *dst = (uint32_t *)U + (c0 / 2) * CO + co;
            for (int i = 0; i < 4; i++) { /* U = t Gᵀ */
                float v[4][16];
                _mm512_storeu_ps(v[0], t[i][0]);
                _mm512_storeu_ps(v[1], _mm512_mul_ps(half, _mm512_add_ps(_mm512_add_ps(t[i][0], t[i][1]), t[i][2])));
                _mm512_storeu_ps(v[2], _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(t[i][0], t[i][1]), t[i][2])));
                _mm512_storeu_ps(v[3], t[i][2]);
                for (int j = 0; j < 4; j++) {
                    uint32_t h[8];
                    cmi_bf16_round16((uint16_t *)h, v[j], 16); /* ci pairs: h[p] = (ci 2p, ci 2p + 1) */
                    uint32_t *d = dst + (int64_t)(4 * i + j) * (CI / 2) * CO;
                    for (int p = 0; p < 8; p++) d[p * CO] = h[p];
                }
            }
        }
}

TGT static inline __m512 wld(const uint16_t *p) { /* 16 bf16 values as f32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* Bᵀ along the 4 rows of input column iw (16 channels from c0 of the rows from ih0; 0 outside
 * the image): e[i] = (Bᵀ d)[i] for that column. */
TGT static inline __attribute__((always_inline)) void wino_col(const wino_args *a, const uint16_t *row[4],
                                                               int64_t iw, int c0, const int CI, __m512 e[4]) {
    __m512 d[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        d[i] = row[i] && iw >= 0 && iw < a->W ? wld(row[i] + iw * CI + c0) : _mm512_setzero_ps();
    e[0] = _mm512_sub_ps(d[0], d[2]);
    e[1] = _mm512_add_ps(d[1], d[2]);
    e[2] = _mm512_sub_ps(d[2], d[1]);
    e[3] = _mm512_sub_ps(d[1], d[3]);
}

/* V of the block's T tiles (R tile rows from th0 of image n), 16 input channels at a time: each
 * input column's row transform is computed once and used by the two tiles it belongs to. */
TGT static inline __attribute__((always_inline)) void wino_input(const wino_args *a, int64_t n, int64_t th0,
                                                                 const int CI) {
    const int64_t H = a->H, W = a->W, T = a->T, TW = W / 2;
    for (int64_t r = 0; r < a->R; r++) {
        const uint16_t *row[4];
        for (int i = 0; i < 4; i++) {
            const int64_t ih = 2 * (th0 + r) - 1 + i;
            row[i] = ih >= 0 && ih < H ? a->in + (n * H + ih) * W * CI : NULL;
        }
        if (th0 + r + 1 < H / 2) /* the next tile row's two new input rows */
            for (int i = 2; i < 4; i++) {
                const char *nx = (const char *)(a->in + (n * H + 2 * (th0 + r) + 1 + i) * W * CI);
                for (int64_t b = 0; b < W * CI * 2; b += 64) _mm_prefetch(nx + b, _MM_HINT_T0);
            }
        for (int c0 = 0; c0 < CI; c0 += 16) {
            __m512 e0[4], e1[4]; /* columns 2tw - 1 and 2tw */
            wino_col(a, row, -1, c0, CI, e0);
            wino_col(a, row, 0, c0, CI, e1);
            for (int64_t tw = 0; tw < TW; tw++) {
                __m512 e2[4], e3[4];
                wino_col(a, row, 2 * tw + 1, c0, CI, e2);
                wino_col(a, row, 2 * tw + 2, c0, CI, e3);
                uint16_t *v = a->V + (r * TW + tw) * CI + c0;
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) { /* (Bᵀ d) B */
                    const __m512 x[4] = {_mm512_sub_ps(e0[i], e2[i]), _mm512_add_ps(e1[i], e2[i]),
                                         _mm512_sub_ps(e2[i], e1[i]), _mm512_sub_ps(e1[i], e3[i])};
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        _mm256_storeu_si256((__m256i *)(v + (4 * i + j) * T * CI), (__m256i)_mm512_cvtneps_pbh(x[j]));
                }
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) e0[i] = e2[i], e1[i] = e3[i];
            }
        }
    }
}

/* M[ξ] = V[ξ] · U[ξ] for the 16 ξ: register tiles of TB tiles x OCB blocks of 16 output channels. */
TGT static inline __attribute__((always_inline)) void wino_gemm(const wino_args *a, const int CI, const int CO,
                                                                const int TB, const int OCB) {
    const int64_t T = a->T;
    const int CP = CI / 2;
    for (int xi = 0; xi < 16; xi++) {
        const uint32_t *V = (const uint32_t *)(a->V + (int64_t)xi * T * CI), *U = a->U + (int64_t)xi * CP * CO;
        float *M = a->M + (int64_t)xi * T * CO;
        for (int64_t t0 = 0; t0 < T; t0 += TB)
            for (int oc0 = 0; oc0 < CO; oc0 += 16 * OCB) {
                __m512 acc[16][4];
#pragma GCC unroll 16
                for (int p = 0; p < TB; p++)
#pragma GCC unroll 4
                    for (int j = 0; j < OCB; j++) acc[p][j] = _mm512_setzero_ps();
                const uint32_t *vp = V + t0 * CP, *up = U + oc0;
                for (int cp = 0; cp < CP; cp++, vp++, up += CO) {
                    __m512bh u[4];
#pragma GCC unroll 4
                    for (int j = 0; j < OCB; j++) u[j] = (__m512bh)_mm512_loadu_si512(up + 16 * j);
#pragma GCC unroll 16
                    for (int p = 0; p < TB; p++) {
                        const __m512bh b = (__m512bh)_mm512_set1_epi32((int)vp[p * CP]);
#pragma GCC unroll 4
                        for (int j = 0; j < OCB; j++) acc[p][j] = _mm512_dpbf16_ps(acc[p][j], u[j], b);
                    }
                }
#pragma GCC unroll 16
                for (int p = 0; p < TB; p++)
#pragma GCC unroll 4
                    for (int j = 0; j < OCB; j++) _mm512_storeu_ps(M + (t0 + p) * CO + oc0 + 16 * j, acc[p][j]);
            }
    }
}

/* Y = Aᵀ M A for block b's tiles, into the output. */
TGT static inline __attribute__((always_inline)) void wino_output(const wino_args *a, int64_t n, int64_t th0,
                                                                  const int CO) {
    const int64_t H = a->H, W = a->W, T = a->T, TW = W / 2;
    for (int64_t t = 0, r = 0, tw = 0; t < T; t++, tw = tw + 1 == TW ? 0 : tw + 1, r += tw == 0) {
        const int64_t oh = 2 * (th0 + r), ow = 2 * tw;
        for (int c0 = 0; c0 < CO; c0 += 16) {
            __m512 m[4][4], s[2][4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) m[i][j] = _mm512_loadu_ps(a->M + ((4 * i + j) * T + t) * CO + c0);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) { /* Aᵀ M */
                s[0][j] = _mm512_add_ps(_mm512_add_ps(m[0][j], m[1][j]), m[2][j]);
                s[1][j] = _mm512_sub_ps(_mm512_sub_ps(m[1][j], m[2][j]), m[3][j]);
            }
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++) { /* (Aᵀ M) A */
                const __m512 y[2] = {_mm512_add_ps(_mm512_add_ps(s[i][0], s[i][1]), s[i][2]),
                                     _mm512_sub_ps(_mm512_sub_ps(s[i][1], s[i][2]), s[i][3])};
#pragma GCC unroll 2
                for (int j = 0; j < 2; j++) {
                    const int64_t o = ((n * H + oh + i) * W + ow + j) * CO + c0;
                    if (a->out_bf16)
                        _mm256_storeu_si256((__m256i *)((uint16_t *)a->out + o), (__m256i)_mm512_cvtneps_pbh(y[j]));
                    else {
                        float *op = (float *)a->out + o;
                        _mm512_storeu_ps(op, a->accumulate ? _mm512_add_ps(_mm512_loadu_ps(op), y[j]) : y[j]);
                    }
                }
            }
        }
    }
}

#define CM_WINO_BLOCK(CI, CO, TB, OCB)                                                                                  \
    TGT static void wblock_##CI##_##CO(const wino_args *a, int64_t n, int64_t th0) {                                   \
        wino_input(a, n, th0, CI);                                                                                     \
        wino_gemm(a, CI, CO, TB, OCB);                                                                                 \
        wino_output(a, n, th0, CO);                                                                                    \
    }
CM_WINO_BLOCK(16, 16, 16, 1)
CM_WINO_BLOCK(16, 32, 8, 2)
CM_WINO_BLOCK(16, 64, 8, 2)
CM_WINO_BLOCK(32, 16, 16, 1)
CM_WINO_BLOCK(32, 32, 8, 2)
CM_WINO_BLOCK(32, 64, 8, 2)
CM_WINO_BLOCK(64, 16, 16, 1)
CM_WINO_BLOCK(64, 32, 8, 2)
CM_WINO_BLOCK(64, 64, 8, 2)
#undef CM_WINO_BLOCK

typedef void (*wblock_fn)(const wino_args *, int64_t, int64_t);

static cm_status wino_call(cm_tape *tp, const cmi_conv_geom *g, bool bwd, const uint16_t *in, cm_dtype ws,
                           const void *w, cm_dtype os, void *out, bool accumulate) {
    const size_t mark = cm_arena_mark(tp->arena);
    const int64_t CI = bwd ? g->Cout : g->Cin, CO = bwd ? g->Cin : g->Cout, R = wino_rows(g), T = R * g->W / 2;
    const int nth = cm_num_threads();
    uint16_t *U = cmi_scratch(tp, sizeof(uint16_t) * (size_t)(16 * CI * CO));
    /* per thread V and M, each thread's its own cache lines */
    const size_t vb = ((size_t)(16 * T * CI) * 2 + 63) / 64 * 64, mb = ((size_t)(16 * T * CO) * 4 + 63) / 64 * 64;
    char *buf = cmi_scratch(tp, (vb + mb) * (size_t)nth + 64);
    if (!U || !buf) return cmi_status(tp);
    buf = (char *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    wino_weights(g, ws, w, bwd, U);
    const int ci = CI == 16 ? 0 : CI == 32 ? 1 : 2, co = CO == 16 ? 0 : CO == 32 ? 1 : 2;
    static const wblock_fn fns[3][3] = {{wblock_16_16, wblock_16_32, wblock_16_64},
                                        {wblock_32_16, wblock_32_32, wblock_32_64},
                                        {wblock_64_16, wblock_64_32, wblock_64_64}};
    const wblock_fn fn = fns[ci][co];
    const int64_t per_image = g->H / 2 / R, blocks = g->N * per_image;
#pragma omp parallel num_threads(nth) if (blocks > 1 && g->N * g->H * g->W * CI * CO >= 65536)
    {
        const int th = omp_get_thread_num();
        wino_args a = {g->N, g->H, g->W, CI, CO, R, T, in, (const uint32_t *)U, out, os == CM_DTYPE_BF16, accumulate,
                       (uint16_t *)(buf + (size_t)th * (vb + mb)), (float *)(buf + (size_t)th * (vb + mb) + vb)};
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) fn(&a, b / per_image, (b % per_image) * R);
    }
    cm_arena_rewind(tp->arena, mark);
    return CM_OK;
}

static cm_status direct_call(cm_tape *tp, const cmi_conv_geom *g, bool bwd, const uint16_t *in, cm_dtype ws,
                             const void *w, cm_dtype os, void *out, bool accumulate) {
    if (accumulate && os != CM_DTYPE_F32)
        return cmi_fail(tp, CM_ERR_INTERNAL, "conv2d: the bf16 direct kernel adds only into an f32 result");
    if (!cmi_conv_direct_bf16_fits(g))
        return cmi_fail(tp, CM_ERR_INTERNAL, "conv2d: the bf16 direct kernel was called on a problem it does not "
                                             "handle (N %lld, Cin %lld, Cout %lld, %lldx%lld)",
                        (long long)g->N, (long long)g->Cin, (long long)g->Cout, (long long)g->H, (long long)g->W);
    /* Winograd where it fits (auto: from 32 channels each way; with 16 it measured no faster) */
    const cmi_conv_algo algo = cmi_conv_get_algo();
    if ((algo == CMI_CONV_ALGO_WINOGRAD || (algo == CMI_CONV_ALGO_AUTO && g->Cin >= 32 && g->Cout >= 32)) &&
        cmi_conv_winograd_bf16_fits(g)) {
        if (wino_call(tp, g, bwd, in, ws, w, os, out, accumulate)) return cmi_status(tp);
        cmi_conv_stats_note(CMI_CONV_RAN_WINOGRAD, bwd ? CMI_CONV_BWD_DATA : CMI_CONV_FWD);
        return CM_OK;
    }
    const size_t mark = cm_arena_mark(tp->arena);
    const int64_t wn = 9 * g->Cin * g->Cout;
    uint16_t *WP = cmi_scratch(tp, sizeof(uint16_t) * (size_t)wn);
    uint16_t *wb = ws == CM_DTYPE_BF16 ? (uint16_t *)w : cmi_scratch(tp, sizeof(uint16_t) * (size_t)wn);
    if (!WP || !wb) return cmi_status(tp);
    if (wb != w) cmi_bf16_round(wb, w, wn); /* rounded in w's order first: one vectorised pass */
    pack_weights(g, wb, bwd, WP);
    const int64_t CI = bwd ? g->Cout : g->Cin, CO = bwd ? g->Cin : g->Cout;
    const direct_args d = {g->N, g->H, g->W, CO, in, WP, out, os == CM_DTYPE_BF16, accumulate};
    direct(&d, CI);
    cm_arena_rewind(tp->arena, mark);
    return CM_OK;
}
#endif

cm_status cmi_conv_fwd_bf16(cm_tape *tp, const cmi_conv_geom *g, const uint16_t *x, cm_dtype ws, const void *w,
                            cm_dtype ys, void *y) {
#ifdef CM_CONV_BF16_X86
    return direct_call(tp, g, false, x, ws, w, ys, y, false);
#else
    (void)x, (void)ws, (void)w, (void)ys, (void)y;
    return cmi_fail(tp, CM_ERR_INTERNAL, "conv2d: the bf16 direct kernel needs x86-64 (N %lld)", (long long)g->N);
#endif
}

cm_status cmi_conv_bwd_data_bf16(cm_tape *tp, const cmi_conv_geom *g, const uint16_t *dy, cm_dtype ws, const void *w,
                                 cm_dtype dxs, void *dx, bool accumulate) {
#ifdef CM_CONV_BF16_X86
    return direct_call(tp, g, true, dy, ws, w, dxs, dx, accumulate);
#else
    (void)dy, (void)ws, (void)w, (void)dxs, (void)dx, (void)accumulate;
    return cmi_fail(tp, CM_ERR_INTERNAL, "conv2d: the bf16 direct kernel needs x86-64 (N %lld)", (long long)g->N);
#endif
}
