/* 2-d convolution on oneDNN's convolution primitives: forward, backward-data, backward-weights,
 * f32 and bf16, NCHW and channels-last, groups and dilation. conv.c chooses between this and its
 * im2col kernel (see dnnl_conv.h); the measurements that set the defaults are in conv.c's header.
 *
 * Each distinct problem — geometry, layout, dtype, pass, bias, activation layout — is built once
 * (descriptors, a primitive descriptor, the primitive, and the reorders between the user's
 * layouts and the ones the primitive picked) and cached for the life of the process, like
 * dnnl_gemm.c: a fixed array under a mutex, never evicted; a problem arriving when it is full gets
 * one-off primitives. A problem oneDNN has no implementation for is cached as such, so it is asked
 * once. Weights are always given to the primitive in format `any` and reordered from (Cout,
 * Cin/g, kh, kw) on every call (they are small); channels-last activations stay as they are and
 * NCHW ones are reordered to oneDNN's blocked layout and back (see cmi_conv_act_layout). In
 * backward, dy (f32, or bf16 from a bf16 consumer) is reordered once into the layout both passes want — and, for bf16,
 * rounded to bf16 by the same reorder: ONEDNN_VERBOSE on a ResNet-56 step had activation
 * reorders at a quarter of oneDNN's time, and a quarter of the reorders into the blocked layout
 * were dy's second one. Scratchpads (and reorder buffers) come from the tape's arena and are given
 * back when the call returns. oneDNN runs its own OpenMP parallel regions, so it uses
 * cm_num_threads() threads (cm_set_num_threads sets OpenMP's count). */
#include "tensor/dnnl_conv.h"
#include "tensor/dnnl_gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define CACHE_CAP 256
#define MAX_ARGS 4

/* ------------------------------------------------------------------------------------------ */
/* Kernel choice and counters                                                                  */
/* ------------------------------------------------------------------------------------------ */

static pthread_once_t g_kernel_once = PTHREAD_ONCE_INIT;
static _Atomic int g_kernel = -1, g_bf16_kernel = -1, g_act_layout = CMI_CONV_ACT_AUTO, g_own_passes = -1,
                   g_algo = -1;

static void kernel_init(void) {
    const char *e = getenv("CM_CONV");
    int k = CMI_CONV_DNNL;
    if (e && strcmp(e, "dnnl") == 0) k = CMI_CONV_DNNL;
    else if (e && strcmp(e, "im2col") == 0) k = CMI_CONV_IM2COL;
    else if (e && *e)
        cm_log_msg(CM_LOG_WARN, "CM_CONV='%s' is not a convolution kernel (use dnnl or im2col); using dnnl", e);
    const char *b = getenv("CM_CONV_BF16");
    int kb = cmi_bf16_native() ? CMI_CONV_BF16_ONEDNN : CMI_CONV_BF16_WIDEN;
    if (b && strcmp(b, "onednn") == 0) kb = CMI_CONV_BF16_ONEDNN;
    else if (b && strcmp(b, "widen") == 0) kb = CMI_CONV_BF16_WIDEN;
    else if (b && *b)
        cm_log_msg(CM_LOG_WARN, "CM_CONV_BF16='%s' is not a bf16 convolution kernel (use onednn or widen); using %s",
                   b, kb == CMI_CONV_BF16_ONEDNN ? "onednn" : "widen");
    const char *ow = getenv("CM_CONV_BF16_OWN");
    int own = 7;
    if (ow && *ow && strcmp(ow, "all") != 0) {
        own = 0;
        const char *names[3] = {"fwd", "data", "weights"};
        for (const char *p = ow; *p;) {
            const size_t len = strcspn(p, ",");
            int bit = -1;
            for (int i = 0; i < 3; i++)
                if (len == strlen(names[i]) && strncmp(p, names[i], len) == 0) bit = i;
            if (bit >= 0) own |= 1 << bit;
            else if (!(len == 4 && strncmp(p, "none", 4) == 0)) {
                cm_log_msg(CM_LOG_WARN,
                           "CM_CONV_BF16_OWN='%s': '%.*s' is not a pass (use all, none, or a comma list of fwd, "
                           "data, weights); using all",
                           ow, (int)len, p);
                own = 7;
                break;
            }
            p += len;
            if (*p == ',') p++;
        }
    }
    const char *a = getenv("CM_CONV_ALGO");
    int algo = CMI_CONV_ALGO_AUTO;
    if (a && strcmp(a, "auto") == 0) algo = CMI_CONV_ALGO_AUTO;
    else if (a && strcmp(a, "direct") == 0) algo = CMI_CONV_ALGO_DIRECT;
    else if (a && strcmp(a, "winograd") == 0) algo = CMI_CONV_ALGO_WINOGRAD;
    else if (a && *a)
        cm_log_msg(CM_LOG_WARN,
                   "CM_CONV_ALGO='%s' is not a convolution algorithm (use auto, direct or winograd); using auto", a);
    int expect = -1;
    atomic_compare_exchange_strong(&g_algo, &expect, algo);
    expect = -1;
    atomic_compare_exchange_strong(&g_kernel, &expect, k);
    expect = -1;
    atomic_compare_exchange_strong(&g_bf16_kernel, &expect, kb);
    expect = -1;
    atomic_compare_exchange_strong(&g_own_passes, &expect, own);
}

unsigned cmi_conv_get_own_passes(void) {
    pthread_once(&g_kernel_once, kernel_init);
    return (unsigned)atomic_load(&g_own_passes);
}

void cmi_conv_set_own_passes(unsigned mask) {
    pthread_once(&g_kernel_once, kernel_init);
    atomic_store(&g_own_passes, (int)(mask & 7u));
}

cmi_conv_kernel cmi_conv_get_kernel(void) {
    pthread_once(&g_kernel_once, kernel_init);
    return (cmi_conv_kernel)atomic_load(&g_kernel);
}

void cmi_conv_set_kernel(cmi_conv_kernel k) {
    pthread_once(&g_kernel_once, kernel_init);
    atomic_store(&g_kernel, (int)k);
}

cmi_conv_bf16_kernel cmi_conv_get_bf16_kernel(void) {
    pthread_once(&g_kernel_once, kernel_init);
    return (cmi_conv_bf16_kernel)atomic_load(&g_bf16_kernel);
}

void cmi_conv_set_bf16_kernel(cmi_conv_bf16_kernel k) {
    pthread_once(&g_kernel_once, kernel_init);
    atomic_store(&g_bf16_kernel, (int)k);
}

cmi_conv_algo cmi_conv_get_algo(void) {
    pthread_once(&g_kernel_once, kernel_init);
    return (cmi_conv_algo)atomic_load(&g_algo);
}

void cmi_conv_set_algo(cmi_conv_algo a) {
    pthread_once(&g_kernel_once, kernel_init);
    atomic_store(&g_algo, (int)a);
}

bool cmi_conv_winograd_f32_available(void) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
    return (isa & avx512) == avx512;
}

cmi_conv_act_layout cmi_conv_get_act_layout(void) { return (cmi_conv_act_layout)atomic_load(&g_act_layout); }
void cmi_conv_set_act_layout(cmi_conv_act_layout l) { atomic_store(&g_act_layout, (int)l); }

static _Atomic int64_t g_stats[CMI_CONV_N_PATHS][CMI_CONV_N_PASSES];
static _Atomic int64_t g_unimplemented;

void cmi_conv_stats_note(cmi_conv_path path, int pass) { atomic_fetch_add(&g_stats[path][pass], 1); }
void cmi_conv_stats_note_unimplemented(void) { atomic_fetch_add(&g_unimplemented, 1); }

void cmi_conv_stats_get(cmi_conv_stats *s) {
    for (int p = 0; p < CMI_CONV_N_PASSES; p++) {
        s->dnnl[p] = atomic_load(&g_stats[CMI_CONV_RAN_DNNL][p]);
        s->dnnl_bf16[p] = atomic_load(&g_stats[CMI_CONV_RAN_DNNL_BF16][p]);
        s->im2col[p] = atomic_load(&g_stats[CMI_CONV_RAN_IM2COL][p]);
        s->widened[p] = atomic_load(&g_stats[CMI_CONV_RAN_WIDENED][p]);
        s->own_bf16[p] = atomic_load(&g_stats[CMI_CONV_RAN_OWN_BF16][p]);
        s->winograd[p] = atomic_load(&g_stats[CMI_CONV_RAN_WINOGRAD][p]);
    }
    s->unimplemented = atomic_load(&g_unimplemented);
}

void cmi_conv_stats_reset(void) {
    for (int k = 0; k < CMI_CONV_N_PATHS; k++)
        for (int p = 0; p < CMI_CONV_N_PASSES; p++) atomic_store(&g_stats[k][p], 0);
    atomic_store(&g_unimplemented, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Primitive cache                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int64_t N, Cin, H, W, Cout, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, groups;
    int32_t cl, bf16, pass, bias, blocked;
    int32_t x_f32, w_f32, y_bf16; /* bf16 compute on an f32 x / f32 w (autocast); a bf16 y (forward) or dy */
    int32_t dx_bf16;              /* backward-data writes a bf16 dx */
    int32_t wino;                 /* f32 Winograd asked for (falls back to direct where oneDNN has none) */
} conv_key;

typedef struct {
    int arg;  /* DNNL_ARG_* */
    bool out; /* written by the primitive */
    dnnl_memory_desc_t user_md, prim_md;
    dnnl_primitive_t reorder; /* user → prim for inputs, prim → user for outputs; NULL when the same */
    size_t prim_bytes;
} conv_arg;

typedef struct {
    conv_key key;
    bool unimplemented;
    bool wino; /* the primitive is oneDNN's Winograd convolution (key.wino and oneDNN had one) */
    dnnl_primitive_t prim;
    int n_args;
    conv_arg args[MAX_ARGS];
    dnnl_memory_desc_t scratch_md;
    size_t scratch_bytes;
} conv_entry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static conv_entry g_cache[CACHE_CAP];
static int g_n_cached;
static dnnl_engine_t g_engine;
static _Thread_local dnnl_stream_t t_stream; /* CPU streams are cheap but not shareable between threads */

static const char *k_pass_name[CMI_CONV_N_PASSES] = {"forward", "backward-data", "backward-weights"};

int cmi_dnnl_conv_cache_size(void) {
    pthread_mutex_lock(&g_lock);
    int n = g_n_cached;
    pthread_mutex_unlock(&g_lock);
    return n;
}

static cm_status dnnl_fail(cm_tape *tp, const char *what, dnnl_status_t s, const conv_key *k) {
    return cmi_fail(tp, CM_ERR_INTERNAL,
                    "conv2d (oneDNN %s, %s%s): %s failed with status %d for x (%lld, %lld, %lld, %lld) %s, weight "
                    "(%lld, %lld, %lld, %lld), stride (%lld, %lld), padding (%lld, %lld), dilation (%lld, %lld), "
                    "groups %lld; CM_CONV=im2col avoids oneDNN",
                    k_pass_name[k->pass], k->bf16 ? "bf16" : "f32", k->blocked ? ", blocked" : "", what, (int)s,
                    (long long)k->N, (long long)(k->cl ? k->H : k->Cin), (long long)(k->cl ? k->W : k->H),
                    (long long)(k->cl ? k->Cin : k->W), k->cl ? "channels-last" : "NCHW", (long long)k->Cout,
                    (long long)(k->Cin / k->groups), (long long)k->kh, (long long)k->kw, (long long)k->sh,
                    (long long)k->sw, (long long)k->ph, (long long)k->pw, (long long)k->dh, (long long)k->dw,
                    (long long)k->groups);
}

static void md_act(dnnl_memory_desc_t *md, int64_t n, int64_t c, int64_t h, int64_t w, dnnl_data_type_t dt,
                   dnnl_format_tag_t tag) {
    dnnl_dims_t d = {n, c, h, w};
    dnnl_memory_desc_init_by_tag(md, 4, d, dt, tag);
}

/* (Cout, Cin/g, kh, kw), seen by oneDNN as goihw (G, Cout/G, Cin/G, kh, kw) when grouped. */
static void md_wei(dnnl_memory_desc_t *md, const conv_key *k, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
    if (k->groups > 1) {
        dnnl_dims_t d = {k->groups, k->Cout / k->groups, k->Cin / k->groups, k->kh, k->kw};
        dnnl_memory_desc_init_by_tag(md, 5, d, dt, tag == dnnl_format_tag_any ? tag : dnnl_goihw);
    } else {
        dnnl_dims_t d = {k->Cout, k->Cin, k->kh, k->kw};
        dnnl_memory_desc_init_by_tag(md, 4, d, dt, tag == dnnl_format_tag_any ? tag : dnnl_oihw);
    }
}

/* The convolution descriptor of pass `pass` over the given memory descriptors. */
static dnnl_status_t conv_desc(dnnl_convolution_desc_t *cd, const conv_key *k, int pass, dnnl_alg_kind_t alg,
                               const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                               const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst) {
    dnnl_dims_t strides = {k->sh, k->sw}, dil = {k->dh - 1, k->dw - 1}, pl = {k->ph, k->pw}, pr = {k->ph, k->pw};
    /* oneDNN checks (H + pl + pr - ((kh-1)(dh) + 1)) / sh + 1 == OH with integer division, which is
     * PyTorch's floor for a non-empty output: pr = pl matches PyTorch's symmetric padding. */
    switch (pass) {
    case CMI_CONV_FWD:
        return dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training, alg, src, wei, bias, dst, strides,
                                                          dil, pl, pr);
    case CMI_CONV_BWD_DATA:
        return dnnl_dilated_convolution_backward_data_desc_init(cd, alg, src, wei, dst, strides, dil, pl, pr);
    default:
        return dnnl_dilated_convolution_backward_weights_desc_init(cd, alg, src, wei, bias, dst, strides, dil, pl,
                                                                   pr);
    }
}

/* Sets up argument i of e: the user's descriptor and what the primitive wants (queried from pd). */
static dnnl_status_t add_arg(conv_entry *e, const_dnnl_primitive_desc_t pd, int arg, bool out,
                             const dnnl_memory_desc_t *user_md, dnnl_query_t q, int qi) {
    conv_arg *a = &e->args[e->n_args++];
    a->arg = arg;
    a->out = out;
    a->user_md = *user_md;
    const dnnl_memory_desc_t *pm = dnnl_primitive_desc_query_md(pd, q, qi);
    a->prim_md = pm ? *pm : *user_md;
    if (dnnl_memory_desc_equal(&a->user_md, &a->prim_md)) return dnnl_success;
    a->prim_bytes = dnnl_memory_desc_get_size(&a->prim_md);
    dnnl_primitive_desc_t rpd = NULL;
    const dnnl_memory_desc_t *from = out ? &a->prim_md : &a->user_md, *to = out ? &a->user_md : &a->prim_md;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&rpd, from, g_engine, to, g_engine, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&a->reorder, rpd);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    return s;
}

static void entry_destroy(conv_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    for (int i = 0; i < e->n_args; i++)
        if (e->args[i].reorder) dnnl_primitive_destroy(e->args[i].reorder);
    memset(e, 0, sizeof *e);
}

/* The primitive descriptor of k's pass with algorithm alg over the primitive-side descriptors
 * (backward passes are created with the forward's as a hint, built here too, its activations in
 * act_tag). On failure *what names the step; dnnl_unimplemented is oneDNN having no kernel for it. */
static dnnl_status_t create_pd(dnnl_primitive_desc_t *pd, const conv_key *k, dnnl_alg_kind_t alg,
                               dnnl_format_tag_t act_tag, const dnnl_memory_desc_t *p_src,
                               const dnnl_memory_desc_t *p_wei,
                               const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *p_dst,
                               const_dnnl_primitive_attr_t attr, const char **what) {
    dnnl_convolution_desc_t cd, fd;
    dnnl_primitive_desc_t hint = NULL;
    dnnl_status_t s;
    *pd = NULL;
    if (k->pass != CMI_CONV_FWD) { /* backward primitives need the forward's descriptor as a hint */
        const dnnl_data_type_t dt = k->bf16 ? dnnl_bf16 : dnnl_f32;
        dnnl_memory_desc_t h_src, h_wei, h_dst;
        md_act(&h_src, k->N, k->Cin, k->H, k->W, dt, act_tag);
        md_act(&h_dst, k->N, k->Cout, k->OH, k->OW, dt, act_tag);
        md_wei(&h_wei, k, dt, dnnl_format_tag_any);
        *what = "forward desc_init (hint)";
        if ((s = conv_desc(&fd, k, CMI_CONV_FWD, alg, &h_src, &h_wei, bias, &h_dst)) != dnnl_success) return s;
        *what = "forward primitive_desc_create (hint)";
        if ((s = dnnl_primitive_desc_create(&hint, &fd, NULL, g_engine, NULL)) != dnnl_success) return s;
    }
    *what = "desc_init";
    s = conv_desc(&cd, k, k->pass, alg, p_src, p_wei, bias, p_dst);
    if (s == dnnl_success) {
        *what = "primitive_desc_create";
        s = dnnl_primitive_desc_create(pd, &cd, attr, g_engine, hint);
    }
    if (hint) dnnl_primitive_desc_destroy(hint);
    return s;
}

/* Builds the primitives for key k into e (not yet in the cache). Called with g_lock held.
 * e->unimplemented when oneDNN has no implementation (not an error). */
static cm_status build(cm_tape *tp, const conv_key *k, conv_entry *e) {
    dnnl_status_t s;
    if (!g_engine && (s = dnnl_engine_create(&g_engine, dnnl_cpu, 0)) != dnnl_success)
        return dnnl_fail(tp, "engine_create", s, k);
    memset(e, 0, sizeof *e);
    e->key = *k;
    const dnnl_data_type_t dt = k->bf16 ? dnnl_bf16 : dnnl_f32;
    const dnnl_format_tag_t user_tag = k->cl ? dnnl_nhwc : dnnl_nchw;
    const dnnl_format_tag_t act_tag = k->blocked ? dnnl_format_tag_any : user_tag;
    /* descriptors, by pass: x/dx (src), w/dw, y/dy (dst), bias/db */
    const dnnl_data_type_t src_dt = k->pass == CMI_CONV_BWD_DATA ? (k->dx_bf16 ? dnnl_bf16 : dnnl_f32) : dt;
    const dnnl_data_type_t dst_dt = k->pass == CMI_CONV_FWD ? (k->y_bf16 ? dnnl_bf16 : dnnl_f32) : dt;
    const dnnl_data_type_t wei_dt = k->pass == CMI_CONV_BWD_WEIGHTS ? dnnl_f32 : dt;
    /* an f32 x or w for a bf16 convolution (autocast): the reorder to the primitive's layout rounds
     * it to bf16 on the way */
    const dnnl_data_type_t u_src_dt = k->x_f32 ? dnnl_f32 : src_dt, u_wei_dt = k->w_f32 ? dnnl_f32 : wei_dt;
    dnnl_memory_desc_t u_src, u_wei, u_dst, u_bias, p_src, p_wei, p_dst;
    md_act(&u_src, k->N, k->Cin, k->H, k->W, u_src_dt, user_tag);
    /* y is f32 in the user's layout, or bf16 (y_bf16: the primitive writes it directly); dy is f32
     * or bf16 (y_bf16 in backward), and in bf16 backward the reorder of an f32 dy to what the
     * primitive wants (bf16, maybe blocked) also rounds it to bf16, in one pass; a bf16 dy in the
     * primitive's layout needs no reorder at all */
    md_act(&u_dst, k->N, k->Cout, k->OH, k->OW, k->y_bf16 ? dnnl_bf16 : dnnl_f32, user_tag);
    md_wei(&u_wei, k, u_wei_dt, dnnl_oihw);
    dnnl_dims_t bd = {k->Cout};
    dnnl_memory_desc_init_by_tag(&u_bias, 1, bd, dnnl_f32, dnnl_a);
    md_act(&p_src, k->N, k->Cin, k->H, k->W, src_dt, act_tag);
    md_act(&p_dst, k->N, k->Cout, k->OH, k->OW, dst_dt, act_tag);
    md_wei(&p_wei, k, wei_dt, dnnl_format_tag_any);

    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    cm_status st = CM_OK;
    if ((s = dnnl_primitive_attr_create(&attr)) != dnnl_success ||
        (s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) != dnnl_success) {
        st = dnnl_fail(tp, "attr", s, k);
        goto done;
    }
    /* Winograd first where asked, then direct; unimplemented for both is not an error */
    for (int wino = k->wino; wino >= 0 && !pd; wino--) {
        const char *what = NULL;
        const dnnl_alg_kind_t alg = wino ? dnnl_convolution_winograd : dnnl_convolution_direct;
        s = create_pd(&pd, k, alg, act_tag, &p_src, &p_wei, k->bias ? &u_bias : NULL, &p_dst, attr, &what);
        if (s == dnnl_unimplemented) continue;
        if (s != dnnl_success) {
            st = dnnl_fail(tp, what, s, k);
            goto done;
        }
        e->wino = wino;
    }
    if (!pd) {
        e->unimplemented = true;
        goto done;
    }
    switch (k->pass) {
    case CMI_CONV_FWD:
        s = add_arg(e, pd, DNNL_ARG_SRC, false, &u_src, dnnl_query_src_md, 0);
        if (!s) s = add_arg(e, pd, DNNL_ARG_WEIGHTS, false, &u_wei, dnnl_query_weights_md, 0);
        if (!s && k->bias) s = add_arg(e, pd, DNNL_ARG_BIAS, false, &u_bias, dnnl_query_weights_md, 1);
        if (!s) s = add_arg(e, pd, DNNL_ARG_DST, true, &u_dst, dnnl_query_dst_md, 0);
        break;
    case CMI_CONV_BWD_DATA:
        s = add_arg(e, pd, DNNL_ARG_DIFF_DST, false, &u_dst, dnnl_query_diff_dst_md, 0);
        if (!s) s = add_arg(e, pd, DNNL_ARG_WEIGHTS, false, &u_wei, dnnl_query_weights_md, 0);
        if (!s) s = add_arg(e, pd, DNNL_ARG_DIFF_SRC, true, &u_src, dnnl_query_diff_src_md, 0);
        break;
    default:
        s = add_arg(e, pd, DNNL_ARG_SRC, false, &u_src, dnnl_query_src_md, 0);
        if (!s) s = add_arg(e, pd, DNNL_ARG_DIFF_DST, false, &u_dst, dnnl_query_diff_dst_md, 0);
        if (!s) s = add_arg(e, pd, DNNL_ARG_DIFF_WEIGHTS, true, &u_wei, dnnl_query_diff_weights_md, 0);
        if (!s && k->bias) s = add_arg(e, pd, DNNL_ARG_DIFF_BIAS, true, &u_bias, dnnl_query_diff_weights_md, 1);
        break;
    }
    if (s != dnnl_success) {
        st = dnnl_fail(tp, "reorder create", s, k);
        goto done;
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (smd) e->scratch_md = *smd;
    e->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if ((s = dnnl_primitive_create(&e->prim, pd)) != dnnl_success) st = dnnl_fail(tp, "primitive_create", s, k);
done:
    if (st) entry_destroy(e);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Execution                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static void make_key(conv_key *k, const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, cm_dtype ws, cm_dtype ys,
                     cm_dtype dxs, int pass, bool bias) {
    memset(k, 0, sizeof *k); /* compared with memcmp: no stray padding bytes */
    k->N = g->N, k->Cin = g->Cin, k->H = g->H, k->W = g->W, k->Cout = g->Cout, k->OH = g->OH, k->OW = g->OW;
    k->kh = g->kh, k->kw = g->kw, k->sh = g->sh, k->sw = g->sw, k->ph = g->ph, k->pw = g->pw, k->dh = g->dh;
    k->dw = g->dw, k->groups = g->groups, k->cl = g->cl, k->bf16 = dt == CM_DTYPE_BF16, k->pass = pass, k->bias = bias;
    k->x_f32 = dt == CM_DTYPE_BF16 && xs == CM_DTYPE_F32 && pass != CMI_CONV_BWD_DATA;
    k->w_f32 = dt == CM_DTYPE_BF16 && ws == CM_DTYPE_F32 && pass != CMI_CONV_BWD_WEIGHTS;
    k->y_bf16 = dt == CM_DTYPE_BF16 && ys == CM_DTYPE_BF16;
    k->dx_bf16 = dt == CM_DTYPE_BF16 && dxs == CM_DTYPE_BF16 && pass == CMI_CONV_BWD_DATA;
    const cmi_conv_act_layout al = cmi_conv_get_act_layout();
    const bool pointwise = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
    k->blocked = al == CMI_CONV_ACT_BLOCKED || (al == CMI_CONV_ACT_AUTO && !g->cl && !pointwise);
    const cmi_conv_algo algo = cmi_conv_get_algo();
    const bool dense3x3 = g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
                          g->groups == 1;
    /* oneDNN 2.6 has f32 Winograd on AVX-512 only: elsewhere ask for direct (a Winograd request
     * falls back to direct anyway, but on the blocked layout, slower for channels-last) */
    k->wino = !k->bf16 && dense3x3 && cmi_conv_winograd_f32_available() &&
              (algo == CMI_CONV_ALGO_WINOGRAD ||
               (algo == CMI_CONV_ALGO_AUTO && g->Cin % 16 == 0 && g->Cout % 16 == 0 && g->Cin >= 32 &&
                g->Cout >= 32 && g->OH >= 4 && g->OW >= 4));
    if (k->wino) k->blocked = 1; /* oneDNN's Winograd kernels work on the blocked layout only */
}

/* The cached entry for k, built on first use. When the cache is full the entry is built into
 * *local and *owned is set: the caller destroys it after use. */
static cm_status lookup(cm_tape *tp, const conv_key *k, conv_entry *local, conv_entry **out, bool *owned) {
    *out = NULL;
    *owned = false;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_cached; i++)
        if (memcmp(&g_cache[i].key, k, sizeof *k) == 0) {
            *out = &g_cache[i];
            break;
        }
    if (!*out) {
        conv_entry *slot = g_n_cached < CACHE_CAP ? &g_cache[g_n_cached] : local;
        cm_status st = build(tp, k, slot);
        if (st) {
            pthread_mutex_unlock(&g_lock);
            return st;
        }
        if (slot == local) *owned = true;
        else g_n_cached++;
        *out = slot;
    }
    pthread_mutex_unlock(&g_lock);
    return CM_OK;
}

static cm_status ensure_stream(cm_tape *tp, const conv_key *k) {
    dnnl_status_t s;
    if (!t_stream && (s = dnnl_stream_create(&t_stream, g_engine, dnnl_stream_default_flags)) != dnnl_success)
        return dnnl_fail(tp, "stream_create", s, k);
    return CM_OK;
}

/* Executes entry e with the user buffers ptr[i] in the order build() adds the arguments:
 *   forward          x, w, [bias], y
 *   backward-data    dy, w, dx
 *   backward-weights x, dy, dw, [db]
 * pre (may be NULL): pre[i] non-NULL is argument i already in the primitive's layout (no reorder). */
static cm_status exec_entry(cm_tape *tp, const conv_entry *e, const void *const *ptr, const void *const *pre) {
    const conv_key *k = &e->key;
    dnnl_status_t s;
    cm_status st = CM_OK;
    dnnl_memory_t umem[MAX_ARGS] = {NULL}, pmem[MAX_ARGS] = {NULL}, smem = NULL;
    dnnl_exec_arg_t args[MAX_ARGS + 1];
    const size_t mark = cm_arena_mark(tp->arena); /* reorder buffers and scratchpad: this call only */
    if ((st = ensure_stream(tp, k))) goto out;
    for (int i = 0; i < e->n_args; i++) {
        const conv_arg *a = &e->args[i];
        if (pre && pre[i]) {
            if ((s = dnnl_memory_create(&pmem[i], &a->prim_md, g_engine, (void *)pre[i])) != dnnl_success) {
                st = dnnl_fail(tp, "memory_create", s, k);
                goto out;
            }
            args[i].arg = a->arg;
            args[i].memory = pmem[i];
            continue;
        }
        if ((s = dnnl_memory_create(&umem[i], &a->user_md, g_engine, (void *)ptr[i])) != dnnl_success) {
            st = dnnl_fail(tp, "memory_create", s, k);
            goto out;
        }
        if (a->reorder) {
            void *buf = cmi_scratch(tp, a->prim_bytes);
            if (!buf) {
                st = cmi_status(tp);
                goto out;
            }
            if ((s = dnnl_memory_create(&pmem[i], &a->prim_md, g_engine, buf)) != dnnl_success) {
                st = dnnl_fail(tp, "memory_create", s, k);
                goto out;
            }
            if (!a->out) {
                dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, umem[i]}, {DNNL_ARG_TO, pmem[i]}};
                if ((s = dnnl_primitive_execute(a->reorder, t_stream, 2, ra)) != dnnl_success) {
                    st = dnnl_fail(tp, "reorder (in)", s, k);
                    goto out;
                }
            }
        }
        args[i].arg = a->arg;
        args[i].memory = pmem[i] ? pmem[i] : umem[i];
    }
    int nargs = e->n_args;
    if (e->scratch_bytes) {
        void *sp = cmi_scratch(tp, e->scratch_bytes);
        if (!sp) {
            st = cmi_status(tp);
            goto out;
        }
        if ((s = dnnl_memory_create(&smem, &e->scratch_md, g_engine, sp)) != dnnl_success) {
            st = dnnl_fail(tp, "memory_create (scratchpad)", s, k);
            goto out;
        }
        args[nargs].arg = DNNL_ARG_SCRATCHPAD;
        args[nargs].memory = smem;
        nargs++;
    }
    if ((s = dnnl_primitive_execute(e->prim, t_stream, nargs, args)) != dnnl_success) {
        st = dnnl_fail(tp, "execute", s, k);
        goto out;
    }
    for (int i = 0; i < e->n_args; i++) {
        const conv_arg *a = &e->args[i];
        if (!a->out || !a->reorder) continue;
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, pmem[i]}, {DNNL_ARG_TO, umem[i]}};
        if ((s = dnnl_primitive_execute(a->reorder, t_stream, 2, ra)) != dnnl_success) {
            st = dnnl_fail(tp, "reorder (out)", s, k);
            goto out;
        }
    }
    if ((s = dnnl_stream_wait(t_stream)) != dnnl_success) st = dnnl_fail(tp, "stream_wait", s, k);
    else {
        cmi_conv_stats_note(k->bf16 ? CMI_CONV_RAN_DNNL_BF16 : CMI_CONV_RAN_DNNL, k->pass);
        if (e->wino) cmi_conv_stats_note(CMI_CONV_RAN_WINOGRAD, k->pass);
    }
out:
    for (int i = 0; i < e->n_args; i++) {
        if (umem[i]) dnnl_memory_destroy(umem[i]);
        if (pmem[i]) dnnl_memory_destroy(pmem[i]);
    }
    if (smem) dnnl_memory_destroy(smem);
    cm_arena_rewind(tp->arena, mark);
    return st;
}

static cm_status check_dt(cm_tape *tp, cm_dtype dt) {
    if (dt != CM_DTYPE_F32 && dt != CM_DTYPE_BF16)
        return cmi_fail(tp, CM_ERR_DTYPE, "conv2d: oneDNN kernel got dtype %s (f32 or bf16)", cm_dtype_name(dt));
    return CM_OK;
}

cm_status cmi_dnnl_conv_forward(cm_tape *tp, const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, cm_dtype ws,
                                const void *x, const void *w, const float *bias, cm_dtype ys, void *y, bool *ran) {
    *ran = false;
    if (check_dt(tp, dt)) return cmi_status(tp);
    conv_key k;
    make_key(&k, g, dt, xs, ws, ys, CM_DTYPE_F32, CMI_CONV_FWD, bias != NULL);
    conv_entry local, *e;
    bool owned;
    if (lookup(tp, &k, &local, &e, &owned)) return cmi_status(tp);
    if (e->unimplemented) {
        cmi_conv_stats_note_unimplemented();
        return CM_OK;
    }
    const void *with_bias[4] = {x, w, bias, y}, *without[3] = {x, w, y};
    cm_status st = exec_entry(tp, e, bias ? with_bias : without, NULL);
    if (!st) *ran = true;
    if (owned) entry_destroy(e);
    return st;
}

cm_status cmi_dnnl_conv_backward(cm_tape *tp, const cmi_conv_geom *g, cm_dtype dt, cm_dtype xs, cm_dtype ws,
                                 const void *x, const void *w, cm_dtype dys, const void *dy, cm_dtype dxs, void *dx,
                                 float *dw, float *db, bool *ran_data, bool *ran_weights) {
    *ran_data = *ran_weights = false;
    if (check_dt(tp, dt) || (dx && check_dt(tp, dxs))) return cmi_status(tp);
    conv_entry local_d, local_w, *ed = NULL, *ew = NULL;
    bool owned_d = false, owned_w = false;
    cm_status st = CM_OK;
    if (dx) {
        conv_key k;
        make_key(&k, g, dt, xs, ws, dys, dxs, CMI_CONV_BWD_DATA, false);
        if ((st = lookup(tp, &k, &local_d, &ed, &owned_d))) goto out;
        if (ed->unimplemented) cmi_conv_stats_note_unimplemented();
    }
    if (dw) {
        conv_key k;
        make_key(&k, g, dt, xs, ws, dys, CM_DTYPE_F32, CMI_CONV_BWD_WEIGHTS, db != NULL);
        if ((st = lookup(tp, &k, &local_w, &ew, &owned_w))) goto out;
        if (ew->unimplemented) cmi_conv_stats_note_unimplemented();
    }
    const bool do_d = ed && !ed->unimplemented, do_w = ew && !ew->unimplemented;
    const size_t mark = cm_arena_mark(tp->arena);
    const void *shared = NULL; /* dy reordered (and in bf16 rounded) once for both passes */
    const conv_arg *ad = do_d ? &ed->args[0] : NULL, *aw = do_w ? &ew->args[1] : NULL; /* DIFF_DST */
    if (ad && aw && ad->reorder && aw->reorder && dnnl_memory_desc_equal(&ad->prim_md, &aw->prim_md)) {
        dnnl_status_t s;
        dnnl_memory_t um = NULL, pm = NULL;
        void *buf = cmi_scratch(tp, ad->prim_bytes);
        if (!buf) {
            st = cmi_status(tp);
            goto out;
        }
        if ((st = ensure_stream(tp, &ed->key))) goto out;
        if ((s = dnnl_memory_create(&um, &ad->user_md, g_engine, (void *)dy)) != dnnl_success ||
            (s = dnnl_memory_create(&pm, &ad->prim_md, g_engine, buf)) != dnnl_success) {
            st = dnnl_fail(tp, "memory_create", s, &ed->key);
        } else {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, pm}};
            if ((s = dnnl_primitive_execute(ad->reorder, t_stream, 2, ra)) != dnnl_success)
                st = dnnl_fail(tp, "reorder (dy)", s, &ed->key);
        }
        if (um) dnnl_memory_destroy(um);
        if (pm) dnnl_memory_destroy(pm);
        if (st) goto out;
        shared = buf;
    }
    if (do_d) {
        const void *p[3] = {dy, w, dx}, *pre[3] = {shared, NULL, NULL};
        if ((st = exec_entry(tp, ed, p, pre))) goto out;
        *ran_data = true;
    }
    if (do_w) {
        const void *p[4] = {x, dy, dw, db}, *pre[4] = {NULL, shared, NULL, NULL};
        if ((st = exec_entry(tp, ew, p, pre))) goto out;
        *ran_weights = true;
    }
    cm_arena_rewind(tp->arena, mark);
out:
    if (owned_d) entry_destroy(ed);
    if (owned_w) entry_destroy(ew);
    return st;
}
