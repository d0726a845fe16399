/* Checks a merged Chrome trace written by the JSONTraceHandler of an N-rank run:
 *   trace_check MERGED.json N
 * valid JSON (an array); metadata first; every other event in time order; pids exactly 0..N-1;
 * on every (pid, tid) the B/E events form a stack (each E closes the B on top, none left open)
 * and no slice (B..E or X) overlaps its parent's end; async b/e in pairs; every collective
 * carries last_rank (a rank) and waited_us (>= 0), and for each collective exactly one rank
 * waited 0 — the last one. Prints what is wrong and exits 1, or prints a summary and exits 0. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...)                                 \
    do {                                          \
        fprintf(stderr, "trace_check: " __VA_ARGS__); \
        fputc('\n', stderr);                      \
        exit(1);                                  \
    } while (0)

static const char *str_of(const cJSON *e, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}
static double num_of(const cJSON *e, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

typedef struct span {
    double t0, t1;
} span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    return x->t1 > y->t1 ? -1 : x->t1 < y->t1;
}

int main(int argc, char **argv) {
    if (argc != 3) FAIL("usage: trace_check MERGED.json N");
    const int world = atoi(argv[2]);
    FILE *f = fopen(argv[1], "rb");
    if (!f) FAIL("cannot open %s", argv[1]);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (fread(text, 1, (size_t)n, f) != (size_t)n) FAIL("cannot read %s", argv[1]);
    text[n] = '\0';
    fclose(f);
    cJSON *arr = cJSON_Parse(text);
    if (!cJSON_IsArray(arr)) FAIL("%s is not a JSON array", argv[1]);
    int seen_pid[256] = {0};
    bool meta_done = false;
    double prev = -INFINITY;
    int64_t n_ev = 0, n_coll = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const char *ph = str_of(e, "ph");
        const int pid = (int)num_of(e, "pid");
        if (pid < 0 || pid >= world || pid >= 256) FAIL("event '%s' has pid %d (not a rank of %d)", str_of(e, "name"), pid, world);
        seen_pid[pid] = 1;
        if (!strcmp(ph, "M")) {
            if (meta_done) FAIL("metadata event '%s' after the other events", str_of(e, "name"));
            continue;
        }
        meta_done = true;
        const double ts = num_of(e, "ts");
        if (!(ts >= prev)) FAIL("event '%s' at %f comes after one at %f", str_of(e, "name"), ts, prev);
        prev = ts;
        n_ev++;
        if (!strcmp(ph, "b") && !strcmp(str_of(e, "cat"), "collective")) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
            const double last = num_of(a, "last_rank"), waited = num_of(a, "waited_us");
            if (!(last >= 0 && last < world) || !(waited >= 0))
                FAIL("collective seq %g on rank %d lacks last_rank/waited_us", num_of(a, "seq"), pid);
            int zero = 0, ranks = 0;
            const cJSON *o;
            cJSON_ArrayForEach(o, arr) {
                if (strcmp(str_of(o, "ph"), "b") || strcmp(str_of(o, "cat"), "collective")) continue;
                const cJSON *oa = cJSON_GetObjectItemCaseSensitive(o, "args");
                if (num_of(oa, "seq") != num_of(a, "seq")) continue;
                ranks++;
                zero += num_of(oa, "waited_us") == 0;
                if (num_of(oa, "last_rank") != last) FAIL("collective seq %g: ranks disagree on the last rank", num_of(a, "seq"));
            }
            if (zero < 1 || ranks != world)
                FAIL("collective seq %g: %d rank(s) recorded it, %d waited 0", num_of(a, "seq"), ranks, zero);
            n_coll++;
        }
    }
    for (int r = 0; r < world; r++)
        if (!seen_pid[r]) FAIL("no event of rank %d", r);
    /* nesting per (pid, tid), in the file's order (which is time order) */
    for (int r = 0; r < world; r++) {
        double tids[64];
        int nt = 0;
        cJSON_ArrayForEach(e, arr) {
            if ((int)num_of(e, "pid") != r || !strcmp(str_of(e, "ph"), "M")) continue;
            double t = num_of(e, "tid");
            bool have = false;
            for (int i = 0; i < nt; i++) have |= tids[i] == t;
            if (!have && nt < 64) tids[nt++] = t;
        }
        for (int k = 0; k < nt; k++) {
            const char *stack[256];
            double starts[256];
            int depth = 0;
            span *sl = malloc(sizeof *sl * (size_t)(n_ev + 1));
            int64_t ns = 0;
            cJSON_ArrayForEach(e, arr) {
                if ((int)num_of(e, "pid") != r || num_of(e, "tid") != tids[k]) continue;
                const char *ph = str_of(e, "ph");
                if (!strcmp(ph, "B")) {
                    if (depth == 256) FAIL("too deep");
                    starts[depth] = num_of(e, "ts");
                    stack[depth++] = str_of(e, "name");
                } else if (!strcmp(ph, "E")) {
                    if (!depth) FAIL("rank %d tid %g: E '%s' with no open B", r, tids[k], str_of(e, "name"));
                    const char *nm = str_of(e, "name");
                    if (nm[0] && strcmp(nm, stack[depth - 1]))
                        FAIL("rank %d: E '%s' closes B '%s'", r, nm, stack[depth - 1]);
                    depth--;
                    sl[ns++] = (span){starts[depth], num_of(e, "ts")};
                } else if (!strcmp(ph, "X")) {
                    sl[ns++] = (span){num_of(e, "ts"), num_of(e, "ts") + num_of(e, "dur")};
                }
            }
            if (depth) FAIL("rank %d tid %g: '%s' left open", r, tids[k], stack[depth - 1]);
            qsort(sl, (size_t)ns, sizeof *sl, span_cmp);
            double ends[512];
            int d = 0;
            for (int64_t i = 0; i < ns; i++) {
                while (d > 0 && ends[d - 1] <= sl[i].t0 + 1e-2) d--;
                if (d > 0 && sl[i].t1 > ends[d - 1] + 1e-2)
                    FAIL("rank %d: slice [%f, %f] overlaps its parent's end %f", r, sl[i].t0, sl[i].t1, ends[d - 1]);
                if (d < 512) ends[d++] = sl[i].t1;
            }
            free(sl);
        }
    }
    printf("trace_check: %s: %lld events of %d ranks, %lld collective starts, all nested and in time order\n", argv[1],
           (long long)n_ev, world, (long long)n_coll);
    cJSON_Delete(arr);
    free(text);
    return 0;
}
