/* MosaicML Streaming's epoch order: numpy's default_rng, the shuffle algorithms (shuffle/py*.py),
 * the partitions over nodes, ranks and workers (partition/{orig,relaxed}.py) and the stream
 * weighting (stream.py apply_weights, sampling.py get_sampling, dataset.py resample_streams), each
 * written to give the same numbers as the Python for the same arguments. */
#include "stream_order_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SeedSequence and PCG64 (numpy/random/bit_generator.pyx, pcg64.h) -------------------- */

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u

static uint32_t ss_hashmix(uint32_t v, uint32_t *h) {
    v ^= *h;
    *h *= SS_MULT_A;
    v *= *h;
    v ^= v >> 16;
    return v;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    r ^= r >> 16;
    return r;
}

void cmi_seedseq_state(uint64_t lo, uint64_t hi, uint64_t out[4]) {
    uint32_t ent[4] = {(uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32)};
    int n = 4;
    while (n > 1 && ent[n - 1] == 0) n--;
    uint32_t pool[4], h = SS_INIT_A;
    for (int i = 0; i < 4; i++) pool[i] = ss_hashmix(i < n ? ent[i] : 0, &h);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &h));
    /* entropy beyond the pool size (none: the pool holds 4 words) */
    uint32_t words[8], hb = SS_INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t d = pool[i % 4];
        d ^= hb;
        hb *= SS_MULT_B;
        d *= hb;
        d ^= d >> 16;
        words[i] = d;
    }
    for (int i = 0; i < 4; i++) out[i] = (uint64_t)words[2 * i] | (uint64_t)words[2 * i + 1] << 32;
}

#define PCG_MULT (((unsigned __int128)0x2360ED051FC65DA4ull << 64) | 0x4385DF649FCCF645ull)

static void pcg_step(cmi_pcg64 *g) { g->state = g->state * PCG_MULT + g->inc; }

void cmi_pcg64_seed(cmi_pcg64 *g, uint64_t lo, uint64_t hi) {
    uint64_t s[4];
    cmi_seedseq_state(lo, hi, s);
    unsigned __int128 initstate = ((unsigned __int128)s[0] << 64) | s[1];
    unsigned __int128 initseq = ((unsigned __int128)s[2] << 64) | s[3];
    g->state = 0;
    g->inc = (initseq << 1) | 1;
    pcg_step(g);
    g->state += initstate;
    pcg_step(g);
    g->has32 = false;
    g->buf32 = 0;
}

uint64_t cmi_pcg64_next64(cmi_pcg64 *g) {
    pcg_step(g);
    uint64_t hi = (uint64_t)(g->state >> 64), lo = (uint64_t)g->state;
    unsigned rot = (unsigned)(hi >> 58);
    uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t cmi_pcg64_next32(cmi_pcg64 *g) {
    if (g->has32) {
        g->has32 = false;
        return g->buf32;
    }
    uint64_t v = cmi_pcg64_next64(g);
    g->has32 = true;
    g->buf32 = (uint32_t)(v >> 32);
    return (uint32_t)v;
}

double cmi_pcg64_double(cmi_pcg64 *g) { return (double)(cmi_pcg64_next64(g) >> 11) * (1.0 / 9007199254740992.0); }

/* numpy's random_interval: masked rejection, 32-bit draws when max fits. */
static uint64_t random_interval(cmi_pcg64 *g, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max, v;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    if (max <= 0xFFFFFFFFull) {
        while ((v = (cmi_pcg64_next32(g) & mask)) > max) {}
    } else {
        while ((v = (cmi_pcg64_next64(g) & mask)) > max) {}
    }
    return v;
}

/* numpy's random_bounded_uint64 without masking: Lemire's method. rng is the inclusive range. */
static uint64_t bounded_u64(cmi_pcg64 *g, uint64_t rng) {
    if (rng == 0) return 0;
    if (rng <= 0xFFFFFFFFull) {
        if (rng == 0xFFFFFFFFull) return cmi_pcg64_next32(g);
        const uint32_t excl = (uint32_t)rng + 1;
        uint64_t m = (uint64_t)cmi_pcg64_next32(g) * excl;
        uint32_t left = (uint32_t)m;
        if (left < excl) {
            const uint32_t thr = (uint32_t)(0xFFFFFFFFu - (uint32_t)rng) % excl;
            while (left < thr) {
                m = (uint64_t)cmi_pcg64_next32(g) * excl;
                left = (uint32_t)m;
            }
        }
        return m >> 32;
    }
    if (rng == UINT64_MAX) return cmi_pcg64_next64(g);
    const uint64_t excl = rng + 1;
    unsigned __int128 m = (unsigned __int128)cmi_pcg64_next64(g) * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
        const uint64_t thr = (UINT64_MAX - rng) % excl;
        while (left < thr) {
            m = (unsigned __int128)cmi_pcg64_next64(g) * excl;
            left = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

void cmi_pcg64_shuffle(cmi_pcg64 *g, int64_t *a, int64_t n) {
    for (int64_t i = n - 1; i >= 1; i--) {
        int64_t j = (int64_t)random_interval(g, (uint64_t)i);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

int64_t cmi_pcg64_integers(cmi_pcg64 *g, int64_t low, int64_t high) {
    return low + (int64_t)bounded_u64(g, (uint64_t)(high - 1 - low));
}

/* numpy computes low + range * u with separate multiply and add roundings: no fused multiply-add
 * (which -march=native would otherwise allow) or the last bit differs. */
__attribute__((optimize("fp-contract=off"))) double cmi_pcg64_uniform(cmi_pcg64 *g, double low, double high) {
    return low + (high - low) * cmi_pcg64_double(g);
}

cm_status cmi_pcg64_choice(cmi_pcg64 *g, int64_t n, int64_t k, int64_t *out) {
    if (k > n || k < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "choice: cannot take %lld of %lld without replacement", (long long)k,
                            (long long)n);
    if (k == 0) return CM_OK;
    if (n > 10000 && k > n / 50) {
        /* tail shuffle of arange(n): positions n-1 .. n-k */
        int64_t *idx = cm_alloc(sizeof(int64_t) * (size_t)n, 64);
        if (!idx) return CM_ERR_OOM;
        for (int64_t i = 0; i < n; i++) idx[i] = i;
        int64_t first = n - k > 1 ? n - k : 1;
        for (int64_t i = n - 1; i >= first; i--) {
            int64_t j = (int64_t)bounded_u64(g, (uint64_t)i);
            int64_t t = idx[j];
            idx[j] = idx[i];
            idx[i] = t;
        }
        memcpy(out, idx + (n - k), sizeof(int64_t) * (size_t)k);
        cm_free(idx);
        return CM_OK;
    }
    /* Floyd's algorithm with numpy's open-addressing set, then a shuffle of the result */
    uint64_t set_size = (uint64_t)(1.2 * (double)k), mask = set_size;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    set_size = mask + 1;
    uint64_t *set = cm_alloc(sizeof(uint64_t) * (size_t)set_size, 64);
    if (!set) return CM_ERR_OOM;
    memset(set, 0xFF, sizeof(uint64_t) * (size_t)set_size);
    for (int64_t j = n - k; j < n; j++) {
        uint64_t val = bounded_u64(g, (uint64_t)j), loc = val & mask;
        while (set[loc] != UINT64_MAX && set[loc] != val) loc = (loc + 1) & mask;
        if (set[loc] == UINT64_MAX) {
            set[loc] = val;
            out[j - n + k] = (int64_t)val;
        } else {
            loc = (uint64_t)j & mask;
            while (set[loc] != UINT64_MAX) loc = (loc + 1) & mask;
            set[loc] = (uint64_t)j;
            out[j - n + k] = j;
        }
    }
    cm_free(set);
    for (int64_t i = k - 1; i >= 1; i--) {
        int64_t j = (int64_t)bounded_u64(g, (uint64_t)i);
        int64_t t = out[j];
        out[j] = out[i];
        out[i] = t;
    }
    return CM_OK;
}

/* ---- shuffles ----------------------------------------------------------------------------- */

static const char *const k_shuffle_algos[] = {"naive", "py1b", "py1br", "py1e", "py1s", "py2s"};

int cmi_shuffle_algo(const char *algo) {
    for (int i = 0; i < 6; i++)
        if (algo && strcmp(algo, k_shuffle_algos[i]) == 0) return i;
    return -1;
}

typedef struct span {
    int64_t b, e;
} span;

/* py1s.divide_spans: cuts the ordered spans into num_parts parts at sample N*(p+1)//num_parts.
 * out has room for n + parts spans; parts gets (begin, end) span index pairs. */
static int64_t divide_spans(span *in, int64_t n, int64_t num_samples, int64_t num_parts, span *out, span *parts) {
    int64_t begin_part = 0, si = 0, so_far = 0, no = 0;
    for (int64_t p = 0; p < num_parts; p++) {
        int64_t part_end = (int64_t)(((__int128)num_samples * (p + 1)) / num_parts);
        while (si < n) {
            span s = in[si];
            int64_t len = s.e - s.b;
            if (part_end < so_far + len) {
                if (so_far < part_end) {
                    int64_t split = part_end - so_far;
                    out[no++] = (span){s.b, s.b + split};
                    in[si].b = s.b + split;
                    so_far += split;
                }
                break;
            }
            out[no++] = s;
            si++;
            so_far += len;
        }
        parts[p] = (span){begin_part, no};
        begin_part = no;
    }
    return no;
}

static void shuffle_spans(cmi_pcg64 *g, span *s, int64_t n) {
    for (int64_t i = n - 1; i >= 1; i--) {
        int64_t j = (int64_t)random_interval(g, (uint64_t)i);
        span t = s[i];
        s[i] = s[j];
        s[j] = t;
    }
}

typedef struct sortkey {
    double pos;
    int64_t i;
} sortkey;

static int cmp_sortkey(const void *a, const void *b) {
    const sortkey *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* py2s: shards as arrays of samples, shuffled once for the run and again per epoch. */
static cm_status shuffle_py2s(const int64_t *sizes, int64_t n_shards, int64_t N, int64_t ncn, uint64_t seed,
                              int64_t epoch, int64_t *ids) {
    /* shard k = samples[off[k] .. off[k]+len[k]) of a working array */
    int64_t *samples = cm_alloc(sizeof(int64_t) * (size_t)(N ? N : 1), 64);
    span *shards = cm_alloc(sizeof(span) * (size_t)(n_shards + 1), 16);
    span *pieces = cm_alloc(sizeof(span) * (size_t)(n_shards + ncn + 1), 16);
    span *parts = cm_alloc(sizeof(span) * (size_t)ncn, 16);
    cm_status st = CM_OK;
    if (!samples || !shards || !pieces || !parts) {
        st = CM_ERR_OOM;
        goto done;
    }
    int64_t off = 0;
    for (int64_t k = 0; k < n_shards; k++) {
        shards[k] = (span){off, off + sizes[k]};
        for (int64_t j = 0; j < sizes[k]; j++) samples[off + j] = off + j;
        off += sizes[k];
    }
    cmi_pcg64 fixed;
    cmi_pcg64_seed(&fixed, seed, 0);
    shuffle_spans(&fixed, shards, n_shards);
    for (int64_t k = 0; k < n_shards; k++) cmi_pcg64_shuffle(&fixed, samples + shards[k].b, shards[k].e - shards[k].b);
    /* _partition cuts shard arrays at part boundaries: the same arithmetic as divide_spans */
    divide_spans(shards, n_shards, N, ncn, pieces, parts);
    cmi_pcg64 eg;
    unsigned __int128 es = (unsigned __int128)seed + (uint64_t)epoch;
    cmi_pcg64_seed(&eg, (uint64_t)es, (uint64_t)(es >> 64));
    int64_t o = 0;
    for (int64_t p = 0; p < ncn; p++) {
        shuffle_spans(&eg, pieces + parts[p].b, parts[p].e - parts[p].b);
        for (int64_t k = parts[p].b; k < parts[p].e; k++) cmi_pcg64_shuffle(&eg, samples + pieces[k].b, pieces[k].e - pieces[k].b);
        for (int64_t k = parts[p].b; k < parts[p].e; k++)
            for (int64_t j = pieces[k].b; j < pieces[k].e; j++) ids[o++] = samples[j];
    }
done:
    cm_free(samples);
    cm_free(shards);
    cm_free(pieces);
    cm_free(parts);
    return st;
}

cm_status cm_streaming_shuffle(const char *algo, const int64_t *shard_sizes, int64_t n_shards, int64_t num_canonical_nodes,
                               uint64_t seed, int64_t epoch, int64_t block_size, int64_t *ids) {
    const int a = cmi_shuffle_algo(algo);
    if (a < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "shuffle_algo '%s' is not one of Streaming's (naive, py1b, py1br, py1e, "
                                                "py1s, py2s)", algo ? algo : "(null)");
    if (num_canonical_nodes < 1 || n_shards < 0 || epoch < 0 || block_size < 1)
        return cm_set_error(CM_ERR_INVALID_ARG, "shuffle: num_canonical_nodes %lld, epoch %lld and block_size %lld must "
                                                "be positive (epoch may be 0)", (long long)num_canonical_nodes,
                            (long long)epoch, (long long)block_size);
    int64_t N = 0;
    for (int64_t k = 0; k < n_shards; k++) {
        if (shard_sizes[k] < 0) return cm_set_error(CM_ERR_INVALID_ARG, "shuffle: shard %lld has a negative size", (long long)k);
        N += shard_sizes[k];
    }
    unsigned __int128 es = (unsigned __int128)seed + (uint64_t)epoch;
    cmi_pcg64 eg;
    if (a == 0) { /* naive */
        cmi_pcg64_seed(&eg, (uint64_t)es, (uint64_t)(es >> 64));
        for (int64_t i = 0; i < N; i++) ids[i] = i;
        cmi_pcg64_shuffle(&eg, ids, N);
        return CM_OK;
    }
    if (a == 5) return shuffle_py2s(shard_sizes, n_shards, N, num_canonical_nodes, seed, epoch, ids);
    span *spans = cm_alloc(sizeof(span) * (size_t)(n_shards + 1), 16);
    span *out = cm_alloc(sizeof(span) * (size_t)(n_shards + num_canonical_nodes + 1), 16);
    span *parts = cm_alloc(sizeof(span) * (size_t)num_canonical_nodes, 16);
    cm_status st = CM_OK;
    double *pos = NULL;
    sortkey *keys = NULL;
    int64_t *tmp = NULL;
    if (!spans || !out || !parts) {
        st = CM_ERR_OOM;
        goto done;
    }
    int64_t off = 0;
    for (int64_t k = 0; k < n_shards; k++) {
        spans[k] = (span){off, off + shard_sizes[k]};
        off += shard_sizes[k];
    }
    cmi_pcg64 rg;
    cmi_pcg64_seed(&rg, seed, 0);
    shuffle_spans(&rg, spans, n_shards);
    divide_spans(spans, n_shards, N, num_canonical_nodes, out, parts);
    cmi_pcg64_seed(&eg, (uint64_t)es, (uint64_t)(es >> 64));
    for (int64_t p = 0; p < num_canonical_nodes; p++) shuffle_spans(&eg, out + parts[p].b, parts[p].e - parts[p].b);
    const int64_t lo_bs = (int64_t)(0.75 * (double)block_size), hi_bs = (int64_t)(1.25 * (double)block_size);
    if (a == 4) { /* py1s: each span shuffled in place */
        int64_t o = 0;
        for (int64_t k = 0; k < parts[num_canonical_nodes - 1].e; k++) {
            int64_t len = out[k].e - out[k].b;
            for (int64_t j = 0; j < len; j++) ids[o + j] = out[k].b + j;
            cmi_pcg64_shuffle(&eg, ids + o, len);
            o += len;
        }
    } else if (a == 1) { /* py1b: fixed blocks of block_size within each canonical node */
        int64_t o = 0;
        for (int64_t p = 0; p < num_canonical_nodes; p++) {
            int64_t start = o;
            for (int64_t k = parts[p].b; k < parts[p].e; k++)
                for (int64_t s = out[k].b; s < out[k].e; s++) ids[o++] = s;
            for (int64_t b = start; b < o; b += block_size) cmi_pcg64_shuffle(&eg, ids + b, (b + block_size < o ? block_size : o - b));
        }
    } else if (a == 2) { /* py1br: staggered blocks of random size */
        int64_t *stagger = cm_alloc(sizeof(int64_t) * (size_t)num_canonical_nodes, 16);
        if (!stagger) {
            st = CM_ERR_OOM;
            goto done;
        }
        if (lo_bs < 1) {
            cm_free(stagger);
            st = cm_set_error(CM_ERR_INVALID_ARG, "py1br: shuffle_block_size %lld is too small (needs >= 2)", (long long)block_size);
            goto done;
        }
        for (int64_t p = 0; p < num_canonical_nodes; p++) stagger[p] = cmi_pcg64_integers(&eg, 0, lo_bs);
        int64_t stop = 0;
        for (int64_t p = 0; p < num_canonical_nodes; p++) {
            int64_t nstart = stop;
            for (int64_t k = parts[p].b; k < parts[p].e; k++)
                for (int64_t s = out[k].b; s < out[k].e; s++) ids[stop++] = s;
            /* draw every block first, then shuffle them (as the Python does) */
            int64_t end = nstart, nb = 0, cap = 16;
            span *blocks = cm_alloc(sizeof(span) * (size_t)cap, 16);
            if (!blocks) {
                cm_free(stagger);
                st = CM_ERR_OOM;
                goto done;
            }
            while (end < stop) {
                int64_t rbs = cmi_pcg64_integers(&eg, lo_bs, hi_bs);
                int64_t b0 = end - stagger[p] > nstart ? end - stagger[p] : nstart;
                int64_t b1 = end + rbs - stagger[p] < stop ? end + rbs - stagger[p] : stop;
                if (nb == cap) {
                    span *nbk = cm_alloc(sizeof(span) * (size_t)cap * 2, 16);
                    if (!nbk) {
                        cm_free(blocks);
                        cm_free(stagger);
                        st = CM_ERR_OOM;
                        goto done;
                    }
                    memcpy(nbk, blocks, sizeof(span) * (size_t)cap);
                    cm_free(blocks);
                    blocks = nbk;
                    cap *= 2;
                }
                blocks[nb++] = (span){b0, b1};
                end += b1 - b0;
            }
            for (int64_t k = 0; k < nb; k++) cmi_pcg64_shuffle(&eg, ids + blocks[k].b, blocks[k].e - blocks[k].b);
            cm_free(blocks);
        }
        cm_free(stagger);
    } else { /* py1e: samples of a span spread over a window of about block_size */
        int64_t o = 0;
        for (int64_t p = 0; p < num_canonical_nodes; p++) {
            int64_t ncn_samples = 0;
            for (int64_t k = parts[p].b; k < parts[p].e; k++) ncn_samples += out[k].e - out[k].b;
            if (ncn_samples == 0) {
                st = cm_set_error(CM_ERR_INVALID_ARG, "py1e: canonical node %lld of %lld gets 0 samples (the stream has "
                                                      "fewer samples than num_canonical_nodes: reduce num_canonical_nodes)",
                                  (long long)p, (long long)num_canonical_nodes);
                goto done;
            }
            cm_free(pos);
            cm_free(keys);
            cm_free(tmp);
            pos = cm_alloc(sizeof(double) * (size_t)ncn_samples, 64);
            keys = cm_alloc(sizeof(sortkey) * (size_t)ncn_samples, 64);
            tmp = cm_alloc(sizeof(int64_t) * (size_t)ncn_samples, 64);
            if (!pos || !keys || !tmp) {
                st = CM_ERR_OOM;
                goto done;
            }
            int64_t at = 0;
            for (int64_t k = parts[p].b; k < parts[p].e; k++) {
                int64_t len = out[k].e - out[k].b;
                for (int64_t j = 0; j < len; j++) tmp[at + j] = out[k].b + j;
                cmi_pcg64_shuffle(&eg, tmp + at, len);
                at += len;
            }
            for (int64_t i = 0; i < ncn_samples; i++) pos[i] = (double)i;
            int64_t so = 0;
            for (int64_t k = parts[p].b; k < parts[p].e; k++) {
                int64_t len = out[k].e - out[k].b;
                int64_t rbs = hi_bs > lo_bs ? cmi_pcg64_integers(&eg, lo_bs, hi_bs) : lo_bs;
                double cutoff = (double)(rbs - len) / 2.0;
                if (cutoff < 0) cutoff = 0;
                double lb = -cutoff > (double)-so ? -cutoff : (double)-so;
                double ub = cutoff < (double)(ncn_samples - so - len) ? cutoff : (double)(ncn_samples - so - len);
                for (int64_t j = 0; j < len; j++) pos[so + j] += cmi_pcg64_uniform(&eg, lb, ub);
                so += len;
            }
            for (int64_t i = 0; i < ncn_samples; i++) keys[i] = (sortkey){pos[i], i};
            qsort(keys, (size_t)ncn_samples, sizeof *keys, cmp_sortkey);
            for (int64_t i = 0; i < ncn_samples; i++) ids[o + i] = tmp[keys[i].i];
            o += ncn_samples;
        }
    }
done:
    cm_free(spans);
    cm_free(out);
    cm_free(parts);
    cm_free(pos);
    cm_free(keys);
    cm_free(tmp);
    return st;
}

/* ---- partitions --------------------------------------------------------------------------- */

/* Python's slice a[start:stop] bounds on a length-n axis (step 1). */
static void py_slice(int64_t start, int64_t stop, int64_t n, int64_t *b, int64_t *e) {
    if (start < 0) start += n;
    if (stop < 0) stop += n;
    *b = start < 0 ? 0 : start > n ? n : start;
    *e = stop < 0 ? 0 : stop > n ? n : stop;
    if (*e < *b) *e = *b;
}

static cm_status partition_orig(int64_t N, int64_t C, int64_t P, int64_t R, int64_t W, int64_t B, int64_t drop,
                                int64_t **out, int64_t shape[5]) {
    if ((C < P && P % C) || (P < C && C % P))
        return cm_set_error(CM_ERR_INVALID_ARG, "partition: %lld canonical nodes and %lld physical nodes: either must "
                                                "divide the other (set num_canonical_nodes to a multiple or divisor of "
                                                "the node count)", (long long)C, (long long)P);
    drop -= drop % P;
    const int64_t spc = (N + C - 1) / C;
    int64_t ratio = 0, pad = 0;
    if (C < P) {
        ratio = P / C;
        int64_t of = spc % ratio;
        if (of) pad = ratio - of;
    }
    const int64_t width = spc + pad;
    int64_t *m = cm_alloc(sizeof(int64_t) * (size_t)(C * width > 0 ? C * width : 1), 64); /* (C, width) */
    if (!m) return CM_ERR_OOM;
    if (N > C || (N == C && C >= P)) {
        for (int64_t c = 0; c < C; c++) {
            int64_t start = (int64_t)(((__int128)c * N) / C), stop = (int64_t)(((__int128)(c + 1) * N) / C);
            for (int64_t j = 0; j < width; j++) m[c * width + j] = start + j;
            if (stop - start < spc) m[c * width + spc - 1] -= 1;
        }
        if (pad) {
            int64_t sb, se;
            py_slice(-pad - ratio + 1 - pad, -pad - ratio + 1, width, &sb, &se);
            if (se - sb != pad) {
                cm_free(m);
                return cm_set_error(CM_ERR_INVALID_ARG, "partition: %lld samples are too few for %lld physical nodes "
                                                        "over %lld canonical nodes", (long long)N, (long long)P, (long long)C);
            }
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < pad; j++) m[c * width + width - pad + j] = m[c * width + sb + j];
        }
    } else {
        if (N < 1) {
            cm_free(m);
            return cm_set_error(CM_ERR_INVALID_ARG, "partition: no samples");
        }
        for (int64_t k = 0; k < C * width; k++) m[k] = k % N;
    }
    /* column-major traversal, drop, deal to nodes */
    const int64_t total = C * width;
    if (drop > total) drop = total;
    const int64_t L = total - drop;
    if (L % P) {
        cm_free(m);
        return cm_set_error(CM_ERR_INVALID_ARG, "partition: %lld samples left cannot be dealt to %lld nodes", (long long)L, (long long)P);
    }
    int64_t Lp = L / P;
    int64_t under = 0, extra_b = 0, extra_e = 0;
    bool tile = false;
    if (Lp % R) {
        under = R - Lp % R;
        if (R + under - 1 <= Lp) py_slice(-R - under + 1, -R + 1, Lp, &extra_b, &extra_e);
        else tile = true;
    }
    const int64_t Lp2 = Lp + under, Lr = Lp2 / R;
    const int64_t WB = W * B, rounded = (Lr + WB - 1) / WB * WB, nb = rounded / WB;
    int64_t *res = cm_alloc(sizeof(int64_t) * (size_t)(P * R * rounded > 0 ? P * R * rounded : 1), 64);
    if (!res) {
        cm_free(m);
        return CM_ERR_OOM;
    }
    for (int64_t p = 0; p < P; p++) {
        /* node sequence element k (k < Lp2) */
        for (int64_t r = 0; r < R; r++) {
            int64_t *rs = res + (p * R + r) * rounded; /* temporarily the rank sequence, (rounded,) */
            for (int64_t k = 0; k < rounded; k++) {
                int64_t q = k * R + r, v = -1;
                if (k < Lr) {
                    int64_t nk;
                    if (q < Lp) nk = q;
                    else if (!tile) nk = extra_b + (q - Lp);
                    else nk = (q - Lp) % Lp;
                    int64_t t = drop + nk * P + p; /* traversal index */
                    v = m[(t % C) * width + t / C];
                }
                rs[k] = v;
            }
        }
    }
    cm_free(m);
    /* (P, R, rounded) -> (P, R, W, nb, B): element [w][b][k] = rank sequence [(b*W + w)*B + k] */
    int64_t *o = cm_alloc(sizeof(int64_t) * (size_t)(P * R * rounded > 0 ? P * R * rounded : 1), 64);
    if (!o) {
        cm_free(res);
        return CM_ERR_OOM;
    }
    for (int64_t pr = 0; pr < P * R; pr++)
        for (int64_t w = 0; w < W; w++)
            for (int64_t b = 0; b < nb; b++)
                memcpy(o + pr * rounded + (w * nb + b) * B, res + pr * rounded + (b * W + w) * B, sizeof(int64_t) * (size_t)B);
    cm_free(res);
    *out = o;
    shape[0] = P, shape[1] = R, shape[2] = W, shape[3] = nb, shape[4] = B;
    return CM_OK;
}

cm_status cm_streaming_partition(const char *algo, int64_t num_samples, int64_t num_canonical_nodes,
                                 int64_t num_physical_nodes, int64_t ranks_per_node, int64_t workers_per_rank,
                                 int64_t batch_size, int64_t drop_first, int64_t initial_physical_nodes, int64_t **out,
                                 int64_t shape[5]) {
    *out = NULL;
    const int64_t N = num_samples, C = num_canonical_nodes, P = num_physical_nodes, R = ranks_per_node,
                  W = workers_per_rank, B = batch_size;
    bool relaxed;
    if (algo && strcmp(algo, "orig") == 0) relaxed = false;
    else if (algo && strcmp(algo, "relaxed") == 0) relaxed = true;
    else return cm_set_error(CM_ERR_INVALID_ARG, "partition_algo '%s' is not one of Streaming's (orig, relaxed)", algo ? algo : "(null)");
    if (N < 1 || C < 1 || P < 1 || R < 1 || W < 1 || B < 1 || drop_first < 0 || initial_physical_nodes < 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "partition: num_samples %lld, num_canonical_nodes %lld, nodes %lld, "
                                                "ranks_per_node %lld, workers %lld and batch_size %lld must be >= 1",
                            (long long)N, (long long)C, (long long)P, (long long)R, (long long)W, (long long)B);
    const int64_t world = P * R, rep = world - N % world;
    if (N + rep < drop_first)
        return cm_set_error(CM_ERR_INVALID_ARG, "Resuming further into the dataset (%lld) than it has samples (%lld)",
                            (long long)drop_first, (long long)N);
    const int64_t ipn = initial_physical_nodes;
    if (!relaxed || ipn == 0 || (P <= C && C % P == 0) || (P > C && P % C == 0))
        return partition_orig(N, C, P, R, W, B, drop_first, out, shape);
    const int64_t G = P * R * B, init_dev = ipn * R;
    if (G % init_dev)
        return cm_set_error(CM_ERR_INVALID_ARG,
                            "A global batch size of %lld is not evenly divisible by the initial total number of devices "
                            "of %lld. Make sure that when using the `relaxed` partitioning algorithm, the global batch "
                            "size does not change during resumption of training.",
                            (long long)G, (long long)init_dev);
    int64_t *part, sh[5];
    cm_status st = partition_orig(N, C, ipn, R, W, G / init_dev, drop_first, &part, sh);
    if (st) return st;
    /* transpose(3, 2, 0, 1, 4).flatten(): order (batch, worker, node, rank, sample) */
    const int64_t total = sh[0] * sh[1] * sh[2] * sh[3] * sh[4];
    if (total % (W * P * R * B)) {
        cm_free(part);
        return cm_set_error(CM_ERR_INVALID_ARG, "partition: %lld positions cannot be reshaped for %lld nodes of %lld ranks",
                            (long long)total, (long long)P, (long long)R);
    }
    int64_t *flat = cm_alloc(sizeof(int64_t) * (size_t)total, 64), *o = cm_alloc(sizeof(int64_t) * (size_t)total, 64);
    if (!flat || !o) {
        cm_free(part);
        cm_free(flat);
        cm_free(o);
        return CM_ERR_OOM;
    }
    int64_t k = 0;
    for (int64_t b = 0; b < sh[3]; b++)
        for (int64_t w = 0; w < sh[2]; w++)
            for (int64_t p = 0; p < sh[0]; p++)
                for (int64_t r = 0; r < sh[1]; r++)
                    for (int64_t s = 0; s < sh[4]; s++)
                        flat[k++] = part[(((p * sh[1] + r) * sh[2] + w) * sh[3] + b) * sh[4] + s];
    cm_free(part);
    /* reshape (nb, W, P, R, B), transpose (2, 3, 1, 0, 4) -> (P, R, W, nb, B) */
    const int64_t nb = total / (W * P * R * B);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t w = 0; w < W; w++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t r = 0; r < R; r++)
                    memcpy(o + (((p * R + r) * W + w) * nb + b) * B, flat + (((b * W + w) * P + p) * R + r) * B,
                           sizeof(int64_t) * (size_t)B);
    cm_free(flat);
    *out = o;
    shape[0] = P, shape[1] = R, shape[2] = W, shape[3] = nb, shape[4] = B;
    return CM_OK;
}
