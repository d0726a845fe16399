/* Compares two `composer train` run folders: the train loss of every batch (metrics.jsonl,
 * "loss/train/total") and every tensor of model.safetensors, value by value.
 *
 *   dist_cli_compare REF_DIR RUN_DIR TOL [--resumed]
 *
 * --resumed: RUN_DIR is a run that resumed from a checkpoint of REF's run (or of one that trains
 * the same), so it logged only the last batches: its losses are compared with REF's last ones.
 *
 * A value passes when |ref - run| <= TOL·max(1, |ref|). Prints the worst difference of each part
 * and exits 0 when everything passes, 1 otherwise (also for missing files, a different number of
 * batches, or tensors whose names, dtypes or shapes differ). */
#include <composer/composer.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LOSSES = 4096 };

typedef struct worst {
    double rel, a, b;
    char where[160];
    long n, bad;
} worst;

static void check(worst *w, double a, double b, double tol, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void check(worst *w, double a, double b, double tol, const char *fmt, ...) {
    const double rel = fabs(a - b) / fmax(1.0, fabs(a));
    w->n++;
    if (!(rel <= tol)) w->bad++;
    if (rel > w->rel || isnan(rel)) {
        w->rel = isnan(rel) ? INFINITY : rel, w->a = a, w->b = b;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->where, sizeof w->where, fmt, ap);
        va_end(ap);
    }
}

/* The "loss/train/total" values of a metrics.jsonl, in file order (one per batch). */
static int read_losses(const char *dir, double *out, int cap) {
    char path[4096], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "compare: cannot open %s\n", path);
        return -1;
    }
    int n = 0;
    const char *key = "\"loss/train/total\":";
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, key);
        if (p && n < cap) out[n++] = strtod(p + strlen(key), NULL);
    }
    fclose(f);
    return n;
}

static int compare_weights(const char *a_dir, const char *b_dir, double tol, worst *w) {
    char pa[4096], pb[4096];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a_dir);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b_dir);
    cm_safetensors *a = NULL, *b = NULL;
    if (cm_safetensors_open(pa, &a) != CM_OK || cm_safetensors_open(pb, &b) != CM_OK) {
        fprintf(stderr, "compare: %s\n", cm_last_error());
        cm_safetensors_close(a);
        return 1;
    }
    int rc = 0;
    if (cm_safetensors_count(a) != cm_safetensors_count(b)) {
        fprintf(stderr, "compare: %zu tensors in %s, %zu in %s\n", cm_safetensors_count(a), pa,
                cm_safetensors_count(b), pb);
        rc = 1;
    }
    for (size_t i = 0; !rc && i < cm_safetensors_count(a); i++) {
        const cm_st_tensor *ta = cm_safetensors_at(a, i);
        const cm_st_tensor *tb = cm_safetensors_find(b, ta->name);
        if (!tb || tb->dtype != ta->dtype || tb->numel != ta->numel || ta->dtype != CM_ST_DTYPE_F32) {
            fprintf(stderr, "compare: tensor %s: missing, or another dtype or size in %s (f32 expected)\n", ta->name,
                    pb);
            rc = 1;
            break;
        }
        for (int64_t k = 0; k < ta->numel; k++) {
            float x, y;
            memcpy(&x, (const char *)ta->data + 4 * k, 4);
            memcpy(&y, (const char *)tb->data + 4 * k, 4);
            check(w, x, y, tol, "%s[%lld]", ta->name, (long long)k);
        }
    }
    cm_safetensors_close(a);
    cm_safetensors_close(b);
    return rc;
}

int main(int argc, char **argv) {
    const bool resumed = argc == 5 && !strcmp(argv[4], "--resumed");
    if (argc != 4 && !resumed) {
        fprintf(stderr, "usage: dist_cli_compare REF_DIR RUN_DIR TOL [--resumed]\n");
        return 2;
    }
    const double tol = atof(argv[3]);
    static double la[MAX_LOSSES], lb[MAX_LOSSES];
    const int na = read_losses(argv[1], la, MAX_LOSSES), nb = read_losses(argv[2], lb, MAX_LOSSES);
    if (na < 0 || nb < 0) return 1;
    if ((resumed ? nb > na || nb == na : na != nb) || nb == 0) {
        fprintf(stderr, "compare: %d train losses in %s, %d in %s%s\n", na, argv[1], nb, argv[2],
                resumed ? " (a resumed run logs fewer, and some)" : "");
        return 1;
    }
    worst wl = {0}, ww = {0};
    const int skip = na - nb; /* --resumed: the batches before the checkpoint */
    for (int i = 0; i < nb; i++) check(&wl, la[skip + i], lb[i], tol, "batch %d", skip + i + 1);
    if (compare_weights(argv[1], argv[2], tol, &ww)) return 1;
    printf("compare %s %s (tol %.3g, |diff|/max(1,|ref|)):\n", argv[1], argv[2], tol);
    printf("  losses:  %ld batches, worst %.3g at %s (%.9g vs %.9g), %ld over\n", wl.n, wl.rel, wl.where, wl.a, wl.b,
           wl.bad);
    printf("  weights: %ld values, worst %.3g at %s (%.9g vs %.9g), %ld over\n", ww.n, ww.rel, ww.where, ww.a, ww.b,
           ww.bad);
    return wl.bad || ww.bad ? 1 : 0;
}
