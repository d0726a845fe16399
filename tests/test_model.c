/* The model interface: the classifier's forward, loss, metrics and FLOPs; the built-in metrics
 * against hand-computed values (ignore_index, strided logits, bad targets); the checks the
 * wrappers make (missing fields, a non-scalar loss, a NULL without an error, bad vtables). */
#include "cmtest.h"

#include <composer/model.h>
#include <math.h>
#include <string.h>

static cm_model *classifier(void) {
    cm_rng rng = cm_rng_init(1, 0);
    cm_module *net;
    cr_assert_eq(cm_nn_linear_new(3, 4, true, &rng, &net), CM_OK);
    cm_classifier_config cc = cm_classifier_config_default();
    cc.input_field = "x";
    cc.flops_per_sample = 72;
    cm_model *m;
    cr_assert_eq(cm_model_classifier_new(net, &cc, &m), CM_OK, "%s", cm_last_error());
    return m;
}

Test(model, classifier_forward_loss_and_metrics) {
    cm_model *m = classifier();
    cr_assert_str_eq(cm_model_type_name(m), "ComposerClassifier");
    cm_module *net = cm_model_module(m);
    cr_assert(cm_module_is_finalized(net));
    cm_tape *tp = cmt_tape();
    const int64_t xs[2] = {6, 3}, ys[1] = {6};
    cm_tensor *x = cmt_randn(tp, 2, xs, 2, false), *y = cmt_randint(tp, 1, ys, 3, 0, 4);
    const char *names[2] = {"x", "label"};
    cm_tensor *fields[2] = {x, y};
    cm_model_batch b = {names, fields, 2, 6, 0};
    cm_tensor *out = cm_model_forward(m, tp, &b);
    cr_assert(out, "%s", cm_tape_error(tp));
    cmt_assert_close("forward", out, cm_module_forward(net, tp, x), 0, 0);
    cmt_assert_close("eval_forward falls back to forward", cm_model_eval_forward(m, tp, &b), out, 0, 0);
    cm_tensor *loss = cm_model_loss(m, tp, out, &b);
    cr_assert(loss, "%s", cm_tape_error(tp));
    cmt_assert_close("loss", loss, cm_cross_entropy(tp, out, y, NULL), 0, 0);
    cr_assert_eq(cm_tape_backward(tp, loss), CM_OK);
    cr_assert_eq(cm_model_n_metrics(m, true), 1);
    cr_assert_eq(cm_model_n_metrics(m, false), 2);
    cm_metric acc = cm_model_metric(m, true, 0), ce = cm_model_metric(m, false, 1);
    cr_assert_str_eq(acc.vt->name, "MulticlassAccuracy");
    cr_assert_str_eq(ce.vt->name, "CrossEntropy");
    cr_assert_null(cm_model_metric(m, true, 1).vt);
    double sa[2] = {0}, sc[2] = {0};
    cr_assert_eq(cm_metric_update(&acc, out, &b, sa), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&ce, out, &b, sc), CM_OK);
    cr_assert_eq(sa[1], 6.0);
    cr_assert(fabs(cm_metric_compute(&ce, sc) - cm_tensor_get_flat(loss, 0)) < 1e-5, "CrossEntropy %g vs loss %g",
              cm_metric_compute(&ce, sc), cm_tensor_get_flat(loss, 0));
    cr_assert_eq(cm_model_flops_per_sample(m, &b), 72.0);
    /* a missing field names the field and the batch's fields */
    const char *bad_names[1] = {"image"};
    cm_model_batch bad = {bad_names, fields, 1, 6, 0};
    cr_assert_null(cm_model_forward(m, tp, &bad));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_tape_error(tp), "'x'") && strstr(cm_tape_error(tp), "image"), "%s", cm_tape_error(tp));
    cm_tape_free(tp);
    cm_model_free(m);
}

Test(model, metrics_match_hand_computed_values) {
    cm_tape *tp = cmt_tape();
    /* logits (2, 2, 3) stored transposed (a strided view); targets with one ignored */
    const float vals[12] = {1, 0, 0, /**/ 0, 2, 1, /**/ 0, 0, 3, /**/ 5, 1, 1};
    const int64_t ls[3] = {2, 3, 2}, ts[2] = {2, 2};
    cm_tensor *raw = cm_empty(tp, CM_DTYPE_F32, 3, ls);
    /* raw (2, 3, 2) holds logits[n][t][c] at [n][c][t] */
    for (int n = 0; n < 2; n++)
        for (int t = 0; t < 2; t++)
            for (int c = 0; c < 3; c++) cm_tensor_set(raw, (int64_t[]){n, c, t}, vals[(n * 2 + t) * 3 + c]);
    cm_tensor *logits = cm_transpose(tp, raw, 1, 2); /* (2, 2, 3) */
    cm_tensor *tgt = cm_empty(tp, CM_DTYPE_I64, 2, ts);
    const int64_t tv[4] = {0, 2, -100, 1}; /* right, wrong (argmax 1), ignored, wrong (argmax 0) */
    for (int i = 0; i < 4; i++) ((int64_t *)cm_tensor_data(tgt))[i] = tv[i];
    const char *names[1] = {"labels"};
    cm_tensor *fields[1] = {tgt};
    cm_model_batch b = {names, fields, 1, 2, 4};
    cm_metric acc = cm_metric_accuracy("labels"), ce = cm_metric_cross_entropy("labels"),
              ppl = cm_metric_perplexity("labels");
    double sa[2] = {0}, sc[2] = {0}, sp[2] = {0};
    cr_assert_eq(cm_metric_update(&acc, logits, &b, sa), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&ce, logits, &b, sc), CM_OK);
    cr_assert_eq(cm_metric_update(&ppl, logits, &b, sp), CM_OK);
    cr_assert(sa[0] == 1 && sa[1] == 3, "accuracy state {%g, %g}", sa[0], sa[1]);
    cr_assert_float_eq(cm_metric_compute(&acc, sa), 1.0 / 3, 1e-12);
    double lse0 = log(exp(1) + 2), lse1 = log(1 + exp(2) + exp(1)), lse3 = log(exp(5) + 2 * exp(1));
    double want = ((lse0 - 1) + (lse1 - 1) + (lse3 - 1)) / 3;
    cr_assert(fabs(cm_metric_compute(&ce, sc) - want) < 1e-6, "ce %g vs %g", cm_metric_compute(&ce, sc), want);
    cr_assert(fabs(cm_metric_compute(&ppl, sp) - exp(want)) < 1e-5);
    cr_assert_str_eq(ppl.vt->name, "LanguagePerplexity");
    double empty[2] = {0};
    cr_assert(isnan(cm_metric_compute(&acc, empty)));
    /* errors */
    ((int64_t *)cm_tensor_data(tgt))[1] = 3;
    cr_assert_eq(cm_metric_update(&acc, logits, &b, sa), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "target 3"), "%s", cm_last_error());
    cm_metric other = cm_metric_accuracy("label");
    cr_assert_eq(cm_metric_update(&other, logits, &b, sa), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "labels"), "lists the batch's fields: %s", cm_last_error());
    fields[0] = cm_empty(tp, CM_DTYPE_I64, 1, ts);
    cr_assert_eq(cm_metric_update(&acc, logits, &b, sa), CM_ERR_SHAPE);
    cr_assert_eq(cm_metric_update(&acc, NULL, &b, sa), CM_ERR_INVALID_ARG);
    cm_tape_free(tp);
}

/* Sparse metrics: a head that ran only on the targeted positions gives logits (n, C) for the n
 * targets that are not -100 (row-major order); they equal the dense metrics on the full logits.
 * Dense logits are taken as the dense metrics take them; a row count other than n is an error
 * naming both. Ties and NaN in accuracy: the first maximum, a NaN being the maximum. */
Test(model, sparse_metrics_equal_the_dense_ones_on_the_targeted_rows) {
    cm_tape *tp = cmt_tape();
    const int64_t B = 2, L = 3, C = 4, ds[3] = {B, L, C}, ts[2] = {B, L};
    cm_tensor *dense = cm_empty(tp, CM_DTYPE_F32, 3, ds), *tgt = cm_empty(tp, CM_DTYPE_I64, 2, ts);
    float *d = cm_tensor_data(dense);
    for (int64_t i = 0; i < B * L * C; i++) d[i] = (float)((i * 37) % 11) * 0.3f - 1.0f;
    const int64_t tv[6] = {-100, 2, 0, -100, -100, 3};
    memcpy(cm_tensor_data(tgt), tv, sizeof tv);
    const int64_t n = 3, ss[2] = {n, C}, rows[3] = {1, 2, 5};
    cm_tensor *sparse = cm_empty(tp, CM_DTYPE_F32, 2, ss);
    for (int64_t k = 0; k < n; k++) memcpy((float *)cm_tensor_data(sparse) + k * C, d + rows[k] * C, sizeof(float) * C);
    const char *names[1] = {"labels"};
    cm_tensor *fields[1] = {tgt};
    cm_model_batch b = {names, fields, 1, B, B * L};
    cm_metric acc = cm_metric_accuracy("labels"), ce = cm_metric_cross_entropy("labels");
    cm_metric sacc = cm_metric_sparse_accuracy("labels"), sce = cm_metric_sparse_cross_entropy("labels");
    cr_assert_str_eq(sacc.vt->name, "MulticlassAccuracy");
    cr_assert_str_eq(sce.vt->name, "LanguageCrossEntropy");
    double a1[2] = {0}, a2[2] = {0}, a3[2] = {0}, c1[2] = {0}, c2[2] = {0}, c3[2] = {0};
    cr_assert_eq(cm_metric_update(&acc, dense, &b, a1), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&sacc, sparse, &b, a2), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&sacc, dense, &b, a3), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&ce, dense, &b, c1), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&sce, sparse, &b, c2), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&sce, dense, &b, c3), CM_OK, "%s", cm_last_error());
    cr_expect(a1[1] == 3 && a1[0] == a2[0] && a1[1] == a2[1] && a1[0] == a3[0] && a1[1] == a3[1],
              "accuracy {%g, %g} {%g, %g} {%g, %g}", a1[0], a1[1], a2[0], a2[1], a3[0], a3[1]);
    cr_expect(c1[1] == 3 && fabs(c1[0] - c2[0]) < 1e-9 && fabs(c1[0] - c3[0]) < 1e-9, "ce %g %g %g", c1[0], c2[0], c3[0]);
    const int64_t bad[2] = {2, C};
    cr_assert_eq(cm_metric_update(&sacc, cm_empty(tp, CM_DTYPE_F32, 2, bad), &b, a2), CM_ERR_SHAPE);
    cr_expect(strstr(cm_last_error(), "(2, 4)") && strstr(cm_last_error(), "(3)"), "%s", cm_last_error());
    /* accuracy's argmax: a tie picks the first, a NaN is the maximum */
    const int64_t one[2] = {2, 3}, one_t[1] = {2};
    cm_tensor *lg = cm_empty(tp, CM_DTYPE_F32, 2, one), *y = cm_empty(tp, CM_DTYPE_I64, 1, one_t);
    const float lv[6] = {1, 3, 3, /**/ 0, NAN, 5};
    const int64_t yv[2] = {1, 1};
    memcpy(cm_tensor_data(lg), lv, sizeof lv);
    memcpy(cm_tensor_data(y), yv, sizeof yv);
    fields[0] = y;
    double a4[2] = {0};
    cr_assert_eq(cm_metric_update(&acc, lg, &b, a4), CM_OK, "%s", cm_last_error());
    cr_expect(a4[0] == 2 && a4[1] == 2, "tie -> column 1, NaN -> column 1: {%g, %g}", a4[0], a4[1]);
    cm_tape_free(tp);
}

/* A model whose loss is not a scalar, and whose forward returns NULL without an error. */
static cm_module *g_net;
static cm_tensor *bad_forward(void *self, cm_tape *tp, const cm_model_batch *b) { return NULL; }
static cm_tensor *bad_loss(void *self, cm_tape *tp, cm_tensor *out, const cm_model_batch *b) { return out; }
static cm_module *bad_module(void *self) { return g_net; }
static cm_metric some_metric(void *self, bool train, int i) { return cm_metric_accuracy("label"); }

Test(model, wrappers_check_what_implementations_return) {
    static const cm_model_i vt = {CM_MODEL_ABI, "Bad", bad_forward, bad_loss, NULL, NULL, NULL, NULL, bad_module, NULL};
    cm_model *m;
    cr_assert_eq(cm_model_new(&vt, NULL, &m), CM_OK);
    cm_tape *tp = cmt_tape();
    cm_model_batch b = {NULL, NULL, 0, 0, 0};
    cr_assert_null(cm_model_forward(m, tp, &b));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_INTERNAL);
    cr_assert(strstr(cm_tape_error(tp), "Bad.forward returned NULL"), "%s", cm_tape_error(tp));
    cm_tape_reset(tp);
    const int64_t s[1] = {3};
    cr_assert_null(cm_model_loss(m, tp, cmt_randn(tp, 1, s, 1, false), &b));
    cr_assert_eq(cm_tape_status(tp), CM_ERR_SHAPE);
    cr_assert(strstr(cm_tape_error(tp), "must be a scalar"), "%s", cm_tape_error(tp));
    cr_assert_eq(cm_model_n_metrics(m, true), 0);
    cr_assert_eq(cm_model_flops_per_sample(m, &b), 0.0);
    cm_model_free(m);
    cm_model_free(NULL);
    /* bad vtables */
    cm_model_i v2 = vt;
    v2.abi = 0;
    cr_assert_eq(cm_model_new(&v2, NULL, &m), CM_ERR_INVALID_ARG);
    v2 = vt;
    v2.loss = NULL;
    cr_assert_eq(cm_model_new(&v2, NULL, &m), CM_ERR_INVALID_ARG);
    v2 = vt;
    v2.n_metrics = NULL;
    v2.metric = some_metric;
    cr_assert_eq(cm_model_new(&v2, NULL, &m), CM_ERR_INVALID_ARG);
    cm_tape_free(tp);
}

Test(model, classifier_config_errors) {
    cm_module *net, *parent;
    cm_nn_linear_new(2, 2, true, NULL, &net);
    cm_model *m;
    cm_classifier_config cc = cm_classifier_config_default();
    cc.target_field = "";
    cr_assert_eq(cm_model_classifier_new(net, &cc, &m), CM_ERR_INVALID_ARG);
    cc = cm_classifier_config_default();
    cc.label_smoothing = 2;
    cr_assert_eq(cm_model_classifier_new(net, &cc, &m), CM_ERR_INVALID_ARG);
    cm_nn_sequential_new(&parent);
    cm_nn_sequential_append(parent, net);
    cr_assert_eq(cm_model_classifier_new(net, NULL, &m), CM_ERR_INVALID_ARG, "net has a parent");
    cr_assert_eq(cm_model_classifier_new(NULL, NULL, &m), CM_ERR_INVALID_ARG);
    cm_module_free(parent);
}

/* Contiguous f32 logits take the parallel float-exp path of the cross-entropy metrics; a strided
 * view of the same values takes the general walk (double exp): both agree, rows wider than one
 * 1024 block included, and a bad target is still reported. */
Test(metrics, cross_entropy_fast_path_matches_general_walk) {
    cm_tape *tp = cmt_tape();
    const int64_t N = 3, T = 41, C = 2500, ls[3] = {N, C, T}, ts[2] = {N, T};
    cm_tensor *raw = cmt_randn(tp, 3, ls, 11, false);                   /* (N, C, T) */
    cm_tensor *strided = cm_transpose(tp, cm_mul_scalar(tp, raw, 4.0f), 1, 2); /* (N, T, C), strided */
    cm_tensor *contig = cm_contiguous(tp, strided);
    cm_tensor *tgt = cm_empty(tp, CM_DTYPE_I64, 2, ts);
    int64_t *tv = cm_tensor_data(tgt);
    for (int64_t i = 0; i < N * T; i++) tv[i] = i % 7 == 3 ? -100 : (i * 131) % C;
    const char *names[1] = {"labels"};
    cm_tensor *fields[1] = {tgt};
    cm_model_batch b = {names, fields, 1, N, N * T};
    cm_metric ce = cm_metric_cross_entropy("labels");
    double slow[2] = {0}, fast[2] = {0};
    cr_assert(!cm_tensor_is_contiguous(strided) && cm_tensor_is_contiguous(contig));
    cr_assert_eq(cm_metric_update(&ce, strided, &b, slow), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&ce, contig, &b, fast), CM_OK, "%s", cm_last_error());
    cr_assert_eq(fast[1], slow[1], "counted rows %g vs %g", fast[1], slow[1]);
    cr_assert(fabs(fast[0] - slow[0]) <= 1e-6 * fabs(slow[0]), "sum %.12g vs %.12g (rel 1e-6)", fast[0], slow[0]);
    tv[5] = C;
    cr_assert_eq(cm_metric_update(&ce, contig, &b, fast), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "target 2500"), "%s", cm_last_error());
    cm_tape_free(tp);
}

/* Accuracy likewise: contiguous f32 logits take the parallel argmax, a strided view the one-row
 * walk. Rows with ties (the first maximum wins), a NaN (the first NaN wins, as torch.argmax),
 * all -inf, ignored targets (-100) and rows wider than any vector: both count the same hits, and
 * a bad target is still reported. */
Test(metrics, accuracy_fast_path_matches_general_walk) {
    cm_tape *tp = cmt_tape();
    const int64_t N = 2, T = 37, C = 3001, ls[3] = {N, C, T}, ts[2] = {N, T};
    cm_tensor *raw = cmt_randn(tp, 3, ls, 12, false); /* (N, C, T) */
    float *rv = cm_tensor_data(raw);
    for (int64_t c = 0; c < C; c++) {
        rv[c * T + 1] = (c == 17 || c == 900) ? 5.0f : 0.0f;            /* a tie: 17 wins */
        rv[c * T + 2] = c == 40 || c == 2000 ? NAN : (c == 7 ? 9.0f : 0.0f); /* NaN at 40 wins */
        rv[c * T + 3] = -INFINITY;                                        /* 0 wins */
    }
    cm_tensor *strided = cm_transpose(tp, raw, 1, 2); /* (N, T, C), strided */
    cm_tensor *contig = cm_contiguous(tp, strided);
    cm_tensor *tgt = cm_empty(tp, CM_DTYPE_I32, 2, ts);
    int32_t *tv = cm_tensor_data(tgt);
    for (int64_t i = 0; i < N * T; i++) tv[i] = i % 5 == 4 ? -100 : (int32_t)((i * 37) % C);
    tv[1] = 17, tv[2] = 40, tv[3] = 0;
    /* rows whose own argmax is the target, so the count is not a near-zero chance one */
    for (int64_t i = 5; i < N * T; i += 3) tv[i] = -1;
    const char *names[1] = {"labels"};
    cm_tensor *fields[1] = {tgt};
    cm_model_batch b = {names, fields, 1, N, N * T};
    cm_metric acc = cm_metric_accuracy("labels");
    double slow[2] = {0}, fast[2] = {0};
    /* the argmax of every third row as its target (found by the one-row walk on one-row batches) */
    for (int64_t i = 5; i < N * T; i += 3) {
        int64_t best = 0;
        const float *row = rv + (i / T) * C * T + i % T;
        for (int64_t c = 1; c < C; c++)
            if (row[c * T] > row[best * T]) best = c;
        tv[i] = (int32_t)best;
    }
    cr_assert(!cm_tensor_is_contiguous(strided) && cm_tensor_is_contiguous(contig));
    cr_assert_eq(cm_metric_update(&acc, strided, &b, slow), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_metric_update(&acc, contig, &b, fast), CM_OK, "%s", cm_last_error());
    cr_assert_eq(fast[1], slow[1], "counted rows %g vs %g", fast[1], slow[1]);
    cr_assert_eq(fast[0], slow[0], "hits %g vs %g", fast[0], slow[0]);
    cr_assert(fast[0] >= 3 + (double)(N * T / 3) - 2, "hits %g: the tie, NaN, -inf and argmax rows should all count",
              fast[0]);
    tv[6] = (int32_t)C;
    cr_assert_eq(cm_metric_update(&acc, contig, &b, fast), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "target 3001"), "%s", cm_last_error());
    cm_tape_free(tp);
}
