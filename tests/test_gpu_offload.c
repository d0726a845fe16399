/*
 * cpu_offload on a GPU (cm_dist_config.cpu_offload; Composer's fsdp_config cpu_offload): the
 * parameters, gradients and optimizer state live in host memory and each wrap unit is uploaded
 * when the tape reads it. Proven on the golden tiny GPT-2 (3 wrap units, AdamW, clipping at norm 1,
 * warmup + cosine):
 *   - it trains the plain GPU run's trajectory (losses and parameters) with dropout on, with and
 *     without microbatching, with each prefetch setting, with activation checkpointing and with
 *     amp_bf16;
 *   - the device allocator's peak falls by about the parameter + gradient + optimizer-state bytes
 *     the plain run holds there, less the units resident at once;
 *   - activation offload (cm_module_set_activation_offload) gives the plain run's bits, alone and
 *     with cpu_offload, and its peak falls by the blocks' activations (to about activation
 *     checkpointing's);
 *   - its checkpoints resume on a plain GPU run and on the CPU, continuing the uninterrupted run —
 *     for a ResNet too, whose BatchNorm running statistics stay on the GPU while its parameters
 *     live in host memory (the checkpoint snapshots them from there);
 *   - what it cannot do is refused by name (a model of one wrap unit, a model already on the GPU or
 *     locked by an optimizer), and cm_dist_free gives the model back on the CPU with its values;
 *   - running out of device memory in an upload is an out-of-memory error naming the unit.
 * Where no GPU can be used the program exits 77 (CTest: skipped); built with -DCM_CUDA=EMU it runs on
 * the CUDA emulator (whose device memory counts are the allocator's, as on a GPU).
 */
#include "cmalgo.h"
#include "cmgolden_gpt2.h"
#include "cmtest.h"
#include "cmtrain.h"
#include "tensor/backend.h"

#include <composer/algorithms.h>
#include <composer/dist.h>
#include <composer/zoo_gpt2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_STEPS CMT_GOLDEN_GPT2_STEPS
#define B CMT_GOLDEN_GPT2_B
#define T CMT_GOLDEN_GPT2_T

typedef struct {
    cm_device device;
    bool offload;
    int64_t microbatch;
    float dropout;
    const char *max_duration;
    const char *save_folder;
    const char *load_path;
    bool forward_prefetch;
    cm_backward_prefetch backward_prefetch; /* + 1: 0 keeps the default */
    bool reset_peak;                        /* reset the allocator's peak before fit, read it after */
    bool act_ckpt;                          /* activation checkpointing of the blocks */
    bool act_offload;                       /* activation offload of the blocks */
    cm_precision precision;
    bool big;                               /* C 128, L 6 (random weights): model state >> the arena's chunks */
    int wide;                               /* with big: C (0 = 128), 8 heads if set */
    int64_t batch;                          /* 0 = B */
} run_opts;

typedef struct {
    cm_model *model;
    cm_optim *opt;
    cm_comm *comm;
    cm_dist *dist;
    cm_dataset *ds;
    cm_dataloader *dl;
    cm_trainer *tr;
    cm_in_memory_logger *mem;
    double loss[16];
    int n_loss;
    size_t peak; /* the device allocator's peak during fit (reset_peak) */
    size_t model_bytes; /* parameters + gradients + AdamW's two moments, f32 */
    size_t max_unit_bytes;
    size_t arena_peak; /* the tape's device arena's peak (reset_peak) */
    int64_t n_offloaded;       /* regions offloaded since the trainer's tape was made */
    size_t offload_peak;       /* the most device bytes behind them at once */
} run;

static cm_model *gpt2_with_dropout(float p) {
    if (p == 0.0f) return cmt_golden_gpt2_model();
    cm_gpt2_config cfg;
    cr_assert_eq(cm_gpt2_config_preset("tiny", &cfg), CM_OK);
    cfg.vocab_size = 64, cfg.n_positions = T;
    cfg.embd_pdrop = cfg.attn_pdrop = cfg.resid_pdrop = p;
    cm_model *m;
    cr_assert_eq(cm_gpt2_new(&cfg, NULL, &m), CM_OK, "%s", cm_last_error());
    return m;
}

/* An optimizer of `kind` over one span per wrap unit named by the unit, as the composer CLI makes
 * it: over the model's unit buffers, or over the offloaded run's host shards (cm_dist_optim_spans)
 * — so checkpoints move between the two. */
static cm_optim *unit_optim(cm_model *m, cm_dist *d, cm_optim_kind kind, const cm_optim_hparams *hp) {
    cm_module *root = cm_model_module(m);
    const cm_optim_span *spans;
    int n = cm_module_n_units(root);
    cm_optim_span *own = calloc((size_t)n, sizeof *own);
    for (int i = 0; i < n; i++) {
        const cm_unit_info *u = cm_module_unit(root, i);
        own[i] = (cm_optim_span){u->name, u->params, u->grads, u->numel};
    }
    spans = own;
    if (d) {
        cr_assert_eq(cm_dist_optim_spans(d, &spans, &n), CM_OK);
        for (int i = 0; i < n; i++)
            cr_assert(spans[i].n == own[i].n && !strcmp(spans[i].name, own[i].name),
                      "one rank: unit %d's shard is the whole unit", i);
    }
    cm_optim *o;
    cr_assert_eq(cm_optim_new(kind, &o), CM_OK);
    cr_assert_eq(cm_optim_add_group(o, hp, spans, n), CM_OK, "%s", cm_last_error());
    free(own);
    return o;
}

/* AdamW with the golden run's hyperparameters (weight decay 0.1 everywhere). */
static cm_optim *adamw(cm_model *m, cm_dist *d) {
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_ADAMW);
    hp.lr = 1e-2, hp.beta1 = 0.9, hp.beta2 = 0.95, hp.eps = 1e-8, hp.weight_decay = 0.1;
    return unit_optim(m, d, CM_OPTIM_ADAMW, &hp);
}

static void run_start(run *r, cmt_golden *g, run_opts o) {
    memset(r, 0, sizeof *r);
    if (o.big) {
        cm_gpt2_config cfg;
        cr_assert_eq(cm_gpt2_config_preset("tiny", &cfg), CM_OK);
        cfg.vocab_size = 64, cfg.n_positions = T, cfg.n_embd = o.wide ? o.wide : 128, cfg.n_layer = 6;
        cfg.n_head = o.wide ? 8 : 4;
        cr_assert_eq(cm_gpt2_new(&cfg, NULL, &r->model), CM_OK, "%s", cm_last_error());
    } else {
        r->model = gpt2_with_dropout(o.dropout);
        cmt_golden_gpt2_load(r->model, "init.");
    }
    cm_module *root = cm_model_module(r->model);
    int marked = 0;
    if (o.act_ckpt) cr_assert_eq(cm_module_checkpoint_policy(root, NULL, 0, &marked), CM_OK, "%s", cm_last_error());
    if (o.act_offload)
        cr_assert_eq(cm_module_activation_offload_policy(root, NULL, 0, &marked), CM_OK, "%s", cm_last_error());
    for (int u = 0; u < cm_module_n_units(root); u++) {
        const size_t b = (size_t)cm_module_unit(root, u)->numel * sizeof(float);
        r->model_bytes += 4 * b;
        if (b > r->max_unit_bytes) r->max_unit_bytes = b;
    }
    if (o.offload) {
        cr_assert_eq(cm_comm_single_new(NULL, &r->comm), CM_OK);
        cm_dist_config dc = cm_dist_config_default();
        dc.cpu_offload = true;
        dc.forward_prefetch = o.forward_prefetch;
        if (o.backward_prefetch) dc.backward_prefetch = o.backward_prefetch - 1;
        cr_assert_eq(cm_dist_new(r->comm, r->model, &dc, &r->dist), CM_OK, "%s", cm_last_error());
        cr_assert_eq(cm_module_device(root), CM_DEVICE_CUDA, "the offloaded model computes on the GPU");
        r->opt = adamw(r->model, r->dist);
    } else {
        cr_assert_eq(cm_module_to_device(root, o.device), CM_OK, "%s", cm_last_error());
        r->opt = adamw(r->model, NULL);
    }
    r->ds = cmt_golden_gpt2_dataset(g, false, false);
    cm_dataloader_config dc = cm_dataloader_config_default();
    dc.batch_size = o.batch ? o.batch : B, dc.shuffle = false;
    cr_assert_eq(cm_dataloader_new(r->ds, &dc, &r->dl), CM_OK, "%s", cm_last_error());
    cm_sched_config sc = cm_sched_config_default(CM_SCHED_COSINE_ANNEALING_WITH_WARMUP);
    cr_assert_eq(cm_time_parse("2ba", &sc.t_warmup), CM_OK);
    cr_assert_eq(cm_time_parse("5ba", &sc.t_max), CM_OK);
    sc.alpha_f = 0.1;
    cm_algorithm_plugin clip;
    cr_assert_eq(cm_grad_clip_new(CM_GRAD_CLIP_NORM, 1.0, &clip), CM_OK);
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&r->mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = r->model;
    c.train_dataloader = r->dl;
    cr_assert_eq(cm_time_parse(o.max_duration ? o.max_duration : "5ba", &c.max_duration), CM_OK);
    c.optimizer = r->opt;
    c.schedulers = &sc, c.n_schedulers = 1;
    c.algorithms = &clip, c.n_algorithms = 1;
    c.loggers = &lp, c.n_loggers = 1;
    c.device_train_microbatch_size = o.microbatch;
    c.precision = o.precision;
    c.device = o.offload ? CM_DEVICE_CUDA : o.device;
    c.run_name = "offload-test";
    if (o.save_folder) {
        c.save_folder = o.save_folder;
        c.save_interval_str = "1ba";
        c.save_overwrite = true;
    }
    c.load_path = o.load_path;
    if (r->dist) cm_dist_trainer_hooks(r->dist, &c);
    cr_assert_eq(cm_trainer_new(&c, &r->tr), CM_OK, "%s", cm_last_error());
    if (r->dist) cr_assert_eq(cm_dist_attach(r->dist, r->tr), CM_OK, "%s", cm_last_error());
    if (o.reset_peak) {
        cr_assert_eq(cm_device_synchronize(CM_DEVICE_CUDA), CM_OK);
        cm_device_reset_peak(CM_DEVICE_CUDA);
    }
    cr_assert_eq(cm_trainer_fit(r->tr, NULL), CM_OK, "%s", cm_last_error());
    if (o.reset_peak) {
        cm_device_memory mm;
        cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &mm), CM_OK);
        r->peak = mm.peak;
        cm_arena *da = cm_tape_device_arena(cm_state_tape(cm_trainer_state(r->tr)), CM_DEVICE_CUDA);
        r->arena_peak = da ? cm_arena_peak(da) : 0;
    }
    r->n_offloaded = cm_tape_n_offloaded(cm_state_tape(cm_trainer_state(r->tr)));
    r->offload_peak = cm_tape_offload_peak_bytes(cm_state_tape(cm_trainer_state(r->tr)));
    r->n_loss = cmt_logged_by_batch(r->mem, "loss/train/total", r->loss, 16);
}

/* The trainer goes; an offloaded model goes back to the CPU, holding the trained values (its GPU
 * ranges hold nothing at rest: read the parameters after this). */
static void run_detach(run *r) {
    cm_trainer_free(r->tr);
    r->tr = NULL;
    cm_dist_free(r->dist);
    r->dist = NULL;
}

static void run_end(run *r) {
    run_detach(r);
    cm_comm_free(r->comm);
    cm_optim_free(r->opt);
    cm_model_free(r->model);
    cm_dataloader_free(r->dl);
    cm_dataset_free(r->ds);
}

/* The largest |a - b| over the parameters of two models (any devices), in two parts: the key part of
 * each c_attn.bias (its gradient is zero in exact arithmetic, so Adam turns rounding noise into steps
 * of up to lr: test_golden_train_gpt2.c explains it) in *noise, everything else returned. */
static double max_param_diff(cm_model *a, cm_model *b, double *noise) {
    double most = 0;
    *noise = 0;
    cm_module *ra = cm_model_module(a), *rb = cm_model_module(b);
    cr_assert_eq(cm_module_n_params(ra), cm_module_n_params(rb));
    for (int64_t i = 0; i < cm_module_n_params(ra); i++) {
        cm_param_info pa = cm_module_param_info(ra, i);
        cm_tensor *x, *y;
        cr_assert_eq(cm_tensor_to_device(pa.tensor, CM_DEVICE_CPU, &x), CM_OK);
        cr_assert_eq(cm_tensor_to_device(cm_module_param_info(rb, i).tensor, CM_DEVICE_CPU, &y), CM_OK);
        const float *xv = cm_tensor_data(x), *yv = cm_tensor_data(y);
        const size_t n = strlen(pa.name);
        const bool bias = n > 16 && !strcmp(pa.name + n - 16, "attn.c_attn.bias");
        const int64_t C = pa.numel / 3;
        for (int64_t k = 0; k < pa.numel; k++) {
            const double d = fabs(xv[k] - yv[k]);
            if (bias && k >= C && k < 2 * C) *noise = fmax(*noise, d);
            else most = fmax(most, d);
        }
        cm_tensor_free(x);
        cm_tensor_free(y);
    }
    return most;
}

/* Parameters equal up to float rounding: 1e-6 (about 16 ulps here; a lost or doubled gradient, a
 * skipped clip or a stale unit moves them by 1e-3 or more), c_attn.bias's key part to 1e-3. */
static void expect_params_close(const char *what, cm_model *a, cm_model *b) {
    double noise;
    const double diff = max_param_diff(a, b, &noise);
    cr_expect(diff <= 1e-6, "%s: parameters after the run differ by %g (tol 1e-6)", what, diff);
    cr_expect(noise <= 1e-3, "%s: c_attn.bias key part differs by %g (tol 1e-3)", what, noise);
}

static void expect_losses_close(const char *what, const run *a, const run *b, int from, int to, double rtol) {
    cr_assert_eq(a->n_loss, to, "%s: %d losses logged, want %d", what, a->n_loss, to);
    for (int k = from; k < to; k++)
        cr_expect(fabs(a->loss[k] - b->loss[k]) <= rtol * fabs(b->loss[k]), "%s step %d: loss %.8f vs %.8f (rel tol %g)",
                  what, k, a->loss[k], b->loss[k], rtol);
}

TestSuite(gpu_offload, .timeout = 600);

/* The optimizer and the clipping norm run on the host (CPU kernels, another summation order than
 * the GPU's), and microbatches' gradients are summed on the host: the same trajectory up to float
 * rounding: 1e-5 relative on the losses, the parameters as expect_params_close says. */
Test(gpu_offload, cpu_offload_trains_the_plain_gpu_trajectory) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_GPT2);
    static const struct {
        int64_t microbatch;
        bool forward_prefetch, act_ckpt;
        cm_backward_prefetch backward_prefetch;
        cm_precision precision;
    } cases[] = {
        {0, false, false, CM_BACKWARD_PREFETCH_POST, CM_PRECISION_FP32},     /* Composer's defaults */
        {2, true, false, CM_BACKWARD_PREFETCH_PRE, CM_PRECISION_FP32},       /* 2 microbatches, prefetch both ways */
        {2, false, true, CM_BACKWARD_PREFETCH_NONE, CM_PRECISION_FP32},      /* activation checkpointing, no prefetch */
        {0, false, false, CM_BACKWARD_PREFETCH_POST, CM_PRECISION_AMP_BF16}, /* bf16 matmuls over the uploaded f32 */
    };
    /* the plain runs: fp32 whole batch, fp32 2 microbatches, amp_bf16 whole batch */
    run plain[3];
    for (int k = 0; k < 3; k++)
        run_start(&plain[k], g, (run_opts){.device = CM_DEVICE_CUDA, .dropout = 0.1f, .microbatch = k == 1 ? 2 : 0,
                                           .precision = k == 2 ? CM_PRECISION_AMP_BF16 : CM_PRECISION_FP32,
                                           .max_duration = "2ba"});
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run o;
        run_start(&o, g, (run_opts){.offload = true, .dropout = 0.1f, .microbatch = cases[i].microbatch,
                                    .forward_prefetch = cases[i].forward_prefetch, .act_ckpt = cases[i].act_ckpt,
                                    .backward_prefetch = cases[i].backward_prefetch + 1,
                                    .precision = cases[i].precision, .max_duration = "2ba"});
        const run *p = &plain[cases[i].precision == CM_PRECISION_AMP_BF16 ? 2 : cases[i].microbatch ? 1 : 0];
        char what[160];
        snprintf(what, sizeof what, "cpu_offload vs plain gpu, %s, microbatch %lld, forward_prefetch %d, %s%s",
                 cm_precision_name(cases[i].precision), (long long)cases[i].microbatch, cases[i].forward_prefetch,
                 cm_backward_prefetch_name(cases[i].backward_prefetch), cases[i].act_ckpt ? ", checkpointed" : "");
        expect_losses_close(what, &o, p, 0, 2, 1e-5);
        const cm_dist_stats st = cm_dist_get_stats(o.dist);
        cr_expect_gt(st.n_gathers, 0, "%s: units were uploaded", what);
        cr_expect(st.max_gathered >= 2 && st.max_gathered <= 4, "%s: 2 resident units + up to 2 in flight, got %d",
                  what, st.max_gathered);
        cr_expect_gt(st.n_buckets_early, 0, "%s: gradients were downloaded during backward", what);
        if (cases[i].backward_prefetch != CM_BACKWARD_PREFETCH_NONE)
            cr_expect_gt(st.n_prefetch_hits, 0, "%s: prefetched uploads were used", what);
        else
            cr_expect_eq(st.n_prefetches, 0, "%s: nothing prefetched", what);
        run_detach(&o);
        cr_assert_eq(cm_module_device(cm_model_module(o.model)), CM_DEVICE_CPU);
        expect_params_close(what, o.model, p->model);
        run_end(&o);
    }
    for (int k = 0; k < 3; k++) run_end(&plain[k]);
    cmt_golden_close(g);
}

static size_t allocated_now(void) {
    cm_device_memory mm;
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &mm), CM_OK);
    return mm.allocated;
}

/* The device allocator's peak over one step, one run at a time (a run's model stays on the device
 * until run_end). Device memory behind offloaded units and regions is mapped in whole granules of
 * the backend's virtual memory (2 MiB on a GPU, a 4 KiB page on the emulator), and the bounds
 * count in them.
 *   - cpu_offload, a GPT of C 128, L 6 (model state >> the arena's chunks): the plain run holds the
 *     parameters, their gradients and AdamW's two moments on the device for the whole fit; the
 *     offloaded run holds the units resident and in flight (max_gathered) and the gradients of at
 *     most 2 units backward is in. What the plain run gives back after its trainer is gone is its
 *     model state as the allocator rounds it; the offloaded peak must be the plain peak less that
 *     state plus between one unit and max_gathered units' parameters and 2 units' gradients (the
 *     activations are the same in both).
 *   - activation offload, a GPT of C 512, L 6 at 16 rows (each block's activations ~13 MB, many
 *     granules): the blocks' activations leave the tape's arena (its peak falls by them) and at
 *     most 2 regions have device memory behind them at once (the block computing and, in backward,
 *     the one prefetched), so the allocator's peak falls by about what left the arena (at least
 *     half: the allocator holds the arena's 1, 2, 4, ... MiB chunks, not its bytes). */
Test(gpu_offload, offload_lowers_the_device_peak) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_GPT2);
    const size_t granule = cmi_backend_get(CM_DEVICE_CUDA)->vm_granularity();
    run p, o, a;
    run_start(&p, g, (run_opts){.device = CM_DEVICE_CUDA, .reset_peak = true, .big = true, .max_duration = "1ba"});
    run_detach(&p);
    const size_t plain = p.peak, held = allocated_now();
    run_end(&p);
    /* (the backend's own scratch stays allocated, in every run's peak) */
    const size_t state = held - allocated_now();
    cr_assert_geq(state, p.model_bytes, "the plain run's state %zu holds the model's %zu bytes", state, p.model_bytes);

    run_start(&o, g, (run_opts){.offload = true, .reset_peak = true, .big = true, .max_duration = "1ba"});
    const cm_dist_stats st = cm_dist_get_stats(o.dist);
    const size_t unit = (o.max_unit_bytes + granule - 1) / granule * granule;
    const long long extra = (long long)o.peak - (long long)(plain - state);
    const long long bound = (long long)(st.max_gathered + 2) * (long long)unit;
    printf("device peak: plain %zu (model state %zu), cpu_offload %zu: %lld above the plain run's activations "
           "(%d units held, unit %zu bytes mapped as %zu)\n",
           plain, state, o.peak, extra, st.max_gathered, o.max_unit_bytes, unit);
    cr_expect(st.max_gathered >= 2 && extra >= (long long)unit && extra <= bound,
              "cpu_offload's peak %zu is the plain peak %zu less its model state %zu plus %lld, want between one unit "
              "(%zu) and %d units' parameters and 2 units' gradients (%lld)",
              o.peak, plain, state, extra, unit, st.max_gathered, bound);
    run_end(&o);

    run w;
    const run_opts wide = {.device = CM_DEVICE_CUDA, .reset_peak = true, .big = true, .wide = 512, .batch = 16,
                           .max_duration = "1ba"};
    run_start(&w, g, wide);
    const size_t wplain = w.peak, wplain_arena = w.arena_peak;
    run_end(&w);
    run_opts ao = wide;
    ao.act_offload = true;
    run_start(&a, g, ao);
    const size_t moved = wplain_arena - a.arena_peak;
    const size_t per = (moved / 6 + granule - 1) / granule * granule;
    printf("device peak: plain %zu (arena %zu), activation offload %zu (arena %zu, %lld regions, at most %zu bytes "
           "behind them, granule %zu)\n",
           wplain, wplain_arena, a.peak, a.arena_peak, (long long)a.n_offloaded, a.offload_peak, granule);
    cr_expect_eq(a.n_offloaded, 6, "every block offloaded once (%lld)", (long long)a.n_offloaded);
    cr_expect(moved / 6 >= 4 * granule, "each block's activations (%zu bytes) span several granules of %zu", moved / 6,
              granule);
    /* the allocator holds the arena's chunks (1, 2, 4, ... MiB), not its bytes: half of what left it */
    cr_expect(a.arena_peak < wplain_arena && wplain > a.peak && wplain - a.peak >= moved / 2,
              "activation offload: the peak falls from %zu to %zu, want at least half the %zu bytes that left the "
              "arena",
              wplain, a.peak, moved);
    /* a region's chunks grow as the arena's do (at most twice what it holds); 3 regions would not fit */
    cr_expect(a.offload_peak <= 2 * 2 * per,
              "at most 2 regions have device memory behind them at once (forward: the one computing; backward: "
              "the one computing and the one prefetched): %zu bytes, want <= 2 regions of at most %zu",
              a.offload_peak, 2 * per);
    run_end(&a);
    cmt_golden_close(g);
}

/* An offloaded run's checkpoints (sharded layout on one rank: the host shards are the values) resume
 * on a plain GPU run, on the CPU and offloaded again, each continuing the uninterrupted run. */
Test(gpu_offload, checkpoints_of_an_offloaded_run_resume_on_a_plain_gpu_run_and_on_the_cpu) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_GPT2);
    char dir[] = "/tmp/cm_gpu_offload_XXXXXX";
    cr_assert(mkdtemp(dir));
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ep0-ba2", dir);
    run full;
    run_start(&full, g, (run_opts){.offload = true, .dropout = 0.1f, .save_folder = dir, .max_duration = "4ba"});
    run_detach(&full);
    static const struct {
        const char *what;
        run_opts o;
    } resumes[] = {
        {"offloaded checkpoint resumed on a plain gpu run", {.device = CM_DEVICE_CUDA}},
        {"offloaded checkpoint resumed on the cpu", {.device = CM_DEVICE_CPU}},
        {"offloaded checkpoint resumed offloaded", {.offload = true}},
    };
    for (size_t i = 0; i < sizeof resumes / sizeof *resumes; i++) {
        run_opts o = resumes[i].o;
        o.dropout = 0.1f, o.load_path = ck, o.max_duration = "4ba";
        run cont;
        run_start(&cont, g, o);
        run_detach(&cont);
        expect_losses_close(resumes[i].what, &cont, &full, 2, 4, 1e-5);
        expect_params_close(resumes[i].what, cont.model, full.model);
        run_end(&cont);
    }
    run_end(&full);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    cmt_golden_close(g);
}

/* One run of the small ResNet rig (BatchNorm; 4 batches an epoch, SGD with momentum) to max_duration
 * on dev, cpu_offload on or off, saving every batch into save (or not) and resuming from load (or
 * not). The train losses go to loss[4]; the model (parameters and buffers) to a CPU copy in *out. */
static void resnet_run(cm_device dev, bool offload, const char *save, const char *load, const char *max_duration,
                       double loss[4], cm_model **out) {
    cmt_rig rig;
    int64_t bpe = 4;
    cmt_rig_resnet(&rig, &bpe);
    cm_module *root = cm_model_module(rig.model);
    cm_comm *comm = NULL;
    cm_dist *dist = NULL;
    if (!offload) cr_assert_eq(cm_module_to_device(root, dev), CM_OK, "%s", cm_last_error());
    if (offload) {
        cr_assert_eq(cm_comm_single_new(NULL, &comm), CM_OK);
        cm_dist_config dc = cm_dist_config_default();
        dc.cpu_offload = true;
        cr_assert_eq(cm_dist_new(comm, rig.model, &dc, &dist), CM_OK, "%s", cm_last_error());
    }
    cm_optim_hparams hp = cm_optim_hparams_default(CM_OPTIM_SGD);
    hp.lr = 0.05, hp.momentum = 0.9;
    cm_optim *opt = unit_optim(rig.model, dist, CM_OPTIM_SGD, &hp);
    cm_in_memory_logger *mem;
    cm_logger_plugin lp;
    cr_assert_eq(cm_in_memory_logger_new(&mem, &lp), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = rig.model, c.train_dataloader = rig.dl, c.device = offload ? CM_DEVICE_CUDA : dev;
    c.optimizer = opt;
    c.loggers = &lp, c.n_loggers = 1;
    c.eval_interval = cm_time_make(0, CM_TIME_EPOCH);
    c.run_name = "offload-resnet";
    c.save_folder = save;
    c.save_interval_str = "1ba";
    c.save_overwrite = true;
    c.load_path = load;
    cr_assert_eq(cm_time_parse(max_duration, &c.max_duration), CM_OK);
    if (dist) cm_dist_trainer_hooks(dist, &c);
    cm_trainer *tr;
    cr_assert_eq(cm_trainer_new(&c, &tr), CM_OK, "%s", cm_last_error());
    if (dist) cr_assert_eq(cm_dist_attach(dist, tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_trainer_fit(tr, NULL), CM_OK, "%s", cm_last_error());
    cmt_logged_by_batch(mem, "loss/train/total", loss, 4);
    cm_trainer_free(tr);
    cm_dist_free(dist); /* an offloaded model comes back to the CPU with its values */
    cm_comm_free(comm);
    cm_optim_free(opt);
    cr_assert_eq(cm_module_to_device(root, CM_DEVICE_CPU), CM_OK, "%s", cm_last_error());
    *out = rig.model;
    rig.model = NULL;
    cmt_rig_free(&rig);
}

/* The largest |a - b| over two CPU models' parameters and buffers (BatchNorm's running statistics). */
static double max_state_diff(cm_model *a, cm_model *b) {
    cm_module *ra = cm_model_module(a), *rb = cm_model_module(b);
    double most = 0;
    for (int64_t i = 0; i < cm_module_n_params(ra); i++) {
        cm_param_info pa = cm_module_param_info(ra, i), pb = cm_module_param_info(rb, i);
        const float *x = cm_tensor_data(pa.tensor), *y = cm_tensor_data(pb.tensor);
        for (int64_t k = 0; k < pa.numel; k++) most = fmax(most, fabs(x[k] - y[k]));
    }
    cr_assert_gt(cm_module_n_buffers(ra), 0, "the ResNet has BatchNorm buffers");
    for (int64_t i = 0; i < cm_module_n_buffers(ra); i++) {
        const cm_tensor *x = cm_module_buffer_info(ra, i).tensor, *y = cm_module_buffer_info(rb, i).tensor;
        if (cm_tensor_dtype(x) != CM_DTYPE_F32) {
            cr_assert_eq(memcmp(cm_tensor_data(x), cm_tensor_data(y), cm_tensor_nbytes(x)), 0, "buffer '%s' differs",
                         cm_module_buffer_info(ra, i).name);
            continue;
        }
        const float *xv = cm_tensor_data(x), *yv = cm_tensor_data(y);
        for (int64_t k = 0; k < cm_tensor_numel(x); k++) most = fmax(most, fabs(xv[k] - yv[k]));
    }
    return most;
}

Test(gpu_offload, a_resnet_checkpoint_carries_its_batchnorm_statistics_from_the_gpu) {
    char dir[] = "/tmp/cm_gpu_offload_rn_XXXXXX";
    cr_assert(mkdtemp(dir));
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ep0-ba2", dir);
    double full[4], plain[4];
    cm_model *m_full, *m_plain;
    resnet_run(CM_DEVICE_CUDA, true, dir, NULL, "4ba", full, &m_full);
    resnet_run(CM_DEVICE_CUDA, false, NULL, NULL, "4ba", plain, &m_plain);
    for (int b = 0; b < 4; b++)
        cr_expect(fabs(full[b] - plain[b]) <= 1e-5 * fabs(plain[b]), "batch %d: offloaded %.8f, plain %.8f", b, full[b],
                  plain[b]);
    cr_expect(max_state_diff(m_full, m_plain) <= 1e-5, "offloaded vs plain GPU ResNet: %g", max_state_diff(m_full, m_plain));
    static const struct {
        const char *what;
        cm_device dev;
        bool offload;
    } resumes[] = {
        {"resumed offloaded", CM_DEVICE_CUDA, true},
        {"resumed on a plain gpu run", CM_DEVICE_CUDA, false},
        {"resumed on the cpu", CM_DEVICE_CPU, false},
    };
    for (size_t i = 0; i < sizeof resumes / sizeof *resumes; i++) {
        double cont[4];
        cm_model *m;
        resnet_run(resumes[i].dev, resumes[i].offload, NULL, ck, "4ba", cont, &m);
        for (int b = 2; b < 4; b++)
            cr_expect(fabs(cont[b] - full[b]) <= 1e-5 * fabs(full[b]), "%s, batch %d: %.8f, uninterrupted %.8f",
                      resumes[i].what, b, cont[b], full[b]);
        const double d = max_state_diff(m, m_full);
        cr_expect(d <= 1e-5, "%s: parameters and BatchNorm statistics differ from the uninterrupted run by %g",
                  resumes[i].what, d);
        cm_model_free(m);
    }
    cr_expect(full[0] != full[3], "the runs trained");
    cm_model_free(m_full);
    cm_model_free(m_plain);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* What cpu_offload cannot do is refused by name, and leaves the model as it was. */
Test(gpu_offload, what_cpu_offload_cannot_do_is_refused_by_name) {
    cm_comm *comm;
    cr_assert_eq(cm_comm_single_new(NULL, &comm), CM_OK);
    cm_dist_config dc = cm_dist_config_default();
    dc.cpu_offload = true;
    cm_dist *d = NULL;
    /* one wrap unit: the whole model would be resident whenever it is used */
    cm_model *mlp = cmt_mlp(8, 16, 4, 0.0f, 1);
    cr_assert_eq(cm_module_n_units(cm_model_module(mlp)), 1);
    cr_assert_eq(cm_dist_new(comm, mlp, &dc, &d), CM_ERR_INVALID_ARG);
    cr_assert_null(d);
    cr_expect(strstr(cm_last_error(), "cpu_offload") && strstr(cm_last_error(), "1 wrap unit") &&
                  strstr(cm_last_error(), "root"),
              "%s", cm_last_error());
    cr_expect_eq(cm_module_device(cm_model_module(mlp)), CM_DEVICE_CPU);
    cm_model_free(mlp);
    /* a model already on the GPU: its parameters' home is the host, made from a CPU model */
    cm_model *m = cmt_golden_gpt2_model();
    cr_assert_eq(cm_module_to_device(cm_model_module(m), CM_DEVICE_CUDA), CM_OK);
    cr_assert_eq(cm_dist_new(comm, m, &dc, &d), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "cpu_offload") && strstr(cm_last_error(), "on the CPU"), "%s", cm_last_error());
    cm_model_free(m);
    /* a model an optimizer already holds */
    m = cmt_golden_gpt2_model();
    cr_assert_eq(cm_module_lock(cm_model_module(m)), CM_OK);
    cr_assert_eq(cm_dist_new(comm, m, &dc, &d), CM_ERR_STATE);
    cr_expect(strstr(cm_last_error(), "locked"), "%s", cm_last_error());
    cm_module_unlock(cm_model_module(m));
    /* ... which then works, and the parameters survive the round trip through host memory */
    cm_tensor *before;
    cr_assert_eq(cm_tensor_to_device(cm_module_param_info(cm_model_module(m), 3).tensor, CM_DEVICE_CPU, &before), CM_OK);
    cr_assert_eq(cm_dist_new(comm, m, &dc, &d), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_module_device(cm_model_module(m)), CM_DEVICE_CUDA);
    cm_dist_free(d);
    cr_assert_eq(cm_module_device(cm_model_module(m)), CM_DEVICE_CPU);
    const cm_tensor *after = cm_module_param_info(cm_model_module(m), 3).tensor;
    cr_expect(!memcmp(cm_tensor_data(before), cm_tensor_data(after), (size_t)cm_tensor_numel(after) * sizeof(float)),
              "the parameters come back as they were");
    cm_tensor_free(before);
    cm_model_free(m);
    cm_comm_free(comm);
}

/* activation offload: the same bits as the plain GPU run (the same ops on the same bytes; only
 * where the bytes wait between forward and backward changes), with dropout and microbatching, alone
 * and with cpu_offload. */
Test(gpu_offload, activation_offload_trains_the_same_bits) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_GPT2);
    for (int mb = 0; mb < 2; mb++) {
        run p;
        run_start(&p, g, (run_opts){.device = CM_DEVICE_CUDA, .dropout = 0.1f, .microbatch = mb ? 2 : 0, .max_duration = "2ba"});
        for (int par = 0; par < 2; par++) {
            run o;
            run_start(&o, g, (run_opts){.device = CM_DEVICE_CUDA, .offload = par, .act_offload = true, .dropout = 0.1f,
                                        .microbatch = mb ? 2 : 0, .max_duration = "2ba"});
            char what[128];
            snprintf(what, sizeof what, "activation offload%s, microbatch %d", par ? " + cpu_offload" : "", mb ? 2 : 0);
            const int64_t want = 2 * 2 * (mb ? 2 : 1); /* 2 blocks, 2 steps, microbatches */
            cr_expect_eq(o.n_offloaded, want, "%s: %lld regions offloaded, want %lld", what, (long long)o.n_offloaded,
                         (long long)want);
            if (!par) {
                for (int k = 0; k < 2; k++)
                    cr_expect(o.loss[k] == p.loss[k], "%s: step %d loss %.9g vs %.9g (bit for bit)", what, k, o.loss[k],
                              p.loss[k]);
            } else {
                expect_losses_close(what, &o, &p, 0, 2, 1e-5);
            }
            run_detach(&o);
            double noise;
            const double diff = max_param_diff(o.model, p.model, &noise);
            if (!par)
                cr_expect(diff == 0 && noise == 0, "%s: parameters differ by %g (%g in c_attn.bias's key part)", what, diff,
                          noise);
            else
                expect_params_close(what, o.model, p.model);
            run_end(&o);
        }
        run_end(&p);
    }
    cmt_golden_close(g);
}

/* A fault: the device's memory runs out while a unit is uploaded (a budget just above what the
 * tape's first chunk needs). The step fails with CM_ERR_OOM naming the unit and the request, nothing crashes, and the
 * model still comes back to the CPU with its values when the cm_dist goes. */
Test(gpu_offload, running_out_of_device_memory_in_an_upload_is_named) {
    cmt_golden *g = cmt_golden_open(CMT_GOLDEN_GPT2);
    run r;
    memset(&r, 0, sizeof r);
    r.model = cmt_golden_gpt2_model();
    cmt_golden_gpt2_load(r.model, "init.");
    cm_tensor *before;
    cr_assert_eq(cm_tensor_to_device(cm_module_param_info(cm_model_module(r.model), 0).tensor, CM_DEVICE_CPU, &before),
                 CM_OK);
    cr_assert_eq(cm_comm_single_new(NULL, &r.comm), CM_OK);
    cm_dist_config dc = cm_dist_config_default();
    dc.cpu_offload = true;
    cr_assert_eq(cm_dist_new(r.comm, r.model, &dc, &r.dist), CM_OK, "%s", cm_last_error());
    r.opt = adamw(r.model, r.dist);
    r.ds = cmt_golden_gpt2_dataset(g, false, false);
    cm_dataloader_config dlc = cm_dataloader_config_default();
    dlc.batch_size = B, dlc.shuffle = false;
    cr_assert_eq(cm_dataloader_new(r.ds, &dlc, &r.dl), CM_OK);
    cm_trainer_config c = cm_trainer_config_default();
    c.model = r.model;
    c.train_dataloader = r.dl;
    cr_assert_eq(cm_time_parse("1ba", &c.max_duration), CM_OK);
    c.optimizer = r.opt;
    c.device = CM_DEVICE_CUDA;
    cm_dist_trainer_hooks(r.dist, &c);
    cr_assert_eq(cm_trainer_new(&c, &r.tr), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_dist_attach(r.dist, r.tr), CM_OK);
    cm_device_memory mm;
    cr_assert_eq(cm_device_memory_stats(CM_DEVICE_CUDA, &mm), CM_OK);
    /* room for the tape arena's first mapping (a granule: 4 KiB on the emulator, 2 MiB on a GPU),
     * not for the embeddings' 12 KB */
    const size_t granule = cmi_backend_get(CM_DEVICE_CUDA)->vm_granularity();
    cm_device_set_memory_budget(CM_DEVICE_CUDA, mm.allocated + granule + 4096);
    const cm_status s = cm_trainer_fit(r.tr, NULL);
    cm_device_set_memory_budget(CM_DEVICE_CUDA, 0);
    cr_expect_eq(s, CM_ERR_OOM, "status %d: %s", (int)s, cm_last_error());
    cr_expect(strstr(cm_last_error(), "cpu_offload: uploading the parameters of unit 'embeddings'") &&
                  strstr(cm_last_error(), "out of memory"),
              "%s", cm_last_error());
    run_detach(&r);
    cr_assert_eq(cm_module_device(cm_model_module(r.model)), CM_DEVICE_CPU);
    const cm_tensor *after = cm_module_param_info(cm_model_module(r.model), 0).tensor;
    cr_expect(!memcmp(cm_tensor_data(before), cm_tensor_data(after), (size_t)cm_tensor_numel(after) * sizeof(float)),
              "the parameters come back as they were (the failed step changed nothing)");
    cm_tensor_free(before);
    run_end(&r);
    cmt_golden_close(g);
}

/* Activation offload's bad input: a block both checkpointed and offloaded fails at its forward
 * naming the module (nothing is left to offload), and cm_tape_offload checks its arguments; on a CPU
 * tape it just runs the region (host memory already). */
static cm_tensor *twice(cm_tape *tp, int n_in, cm_tensor *const *in, void *data) {
    (void)n_in, (void)data;
    return cm_mul_scalar(tp, in[0], 2.0);
}

Test(gpu_offload, activation_offload_refuses_what_it_cannot_do) {
    cm_model *m = cmt_golden_gpt2_model();
    cm_module *root = cm_model_module(m);
    cr_assert_eq(cm_module_to_device(root, CM_DEVICE_CUDA), CM_OK, "%s", cm_last_error());
    cm_module *blk = cm_module_find(root, "transformer.h.0");
    cr_assert_not_null(blk);
    cm_module_set_checkpointing(blk, true);
    cm_module_set_activation_offload(blk, true);
    cm_tape *tp;
    cr_assert_eq(cm_tape_new(NULL, &tp), CM_OK);
    cr_assert_eq(cm_tape_set_device(tp, CM_DEVICE_CUDA), CM_OK);
    cm_tensor *x = cm_full(tp, CM_DTYPE_F32, 3, (int64_t[]){1, T, 32}, 0.5);
    cr_assert_not_null(x);
    cr_assert_null(cm_module_forward(blk, tp, x));
    cr_expect_eq(cm_tape_status(tp), CM_ERR_UNSUPPORTED);
    cr_expect(strstr(cm_tape_error(tp), "transformer.h.0") && strstr(cm_tape_error(tp), "nothing to offload"), "%s",
              cm_tape_error(tp));
    cm_tape_reset(tp);
    cr_assert_null(cm_tape_offload(tp, NULL, NULL, 0, NULL));
    cr_expect_eq(cm_tape_status(tp), CM_ERR_INVALID_ARG);
    cr_expect(strstr(cm_tape_error(tp), "fn is NULL"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
    /* a CPU tape: the region runs as it is, nothing offloaded */
    cr_assert_eq(cm_tape_new(NULL, &tp), CM_OK);
    cm_tensor *h = cm_full(tp, CM_DTYPE_F32, 1, (int64_t[]){4}, 1.5);
    cm_tensor *y = cm_tape_offload(tp, twice, NULL, 1, &h);
    cr_assert_not_null(y, "%s", cm_tape_error(tp));
    cr_expect_eq(cm_tensor_get_flat(y, 3), 3.0);
    cr_expect_eq(cm_tape_n_offloaded(tp), 0);
    cm_tape_free(tp);
    cm_model_free(m);
}

int main(int argc, char *argv[]) { return cmt_gpu_main(argc, argv, "test_gpu_offload", false); }
