/* Collectives on however many ranks the launcher started: every result is checked against the
 * closed form, on every rank. Exit 0 when all hold; prints the first mismatch otherwise. Run as
 * `composer -n N build/tests/dist/dist_collectives`. */
#include <composer/composer.h>
#include <composer/dist.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            fails++;                                                       \
        }                                                                  \
    } while (0)
#define OK(call) CHECK((call) == CM_OK, "%s: %s", #call, cm_last_error())

int main(void) {
    cm_comm *c;
    int rank = -1;
    if (cm_comm_auto_new(NULL, &c) != CM_OK) {
        fprintf(stderr, "comm: %s\n", cm_last_error());
        return 1;
    }
    rank = cm_comm_rank(c);
    const int P = cm_comm_size(c);
    cm_dist_env env = cm_dist_env_get();
    CHECK(env.rank == rank && env.world_size == P, "env says rank %d of %d, MPI says %d of %d", env.rank,
          env.world_size, rank, P);
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    CHECK(r && atoi(r) == rank && w && atoi(w) == P, "RANK=%s WORLD_SIZE=%s for rank %d of %d", r ? r : "-",
          w ? w : "-", rank, P);
    CHECK(getenv("LOCAL_RANK") && getenv("LOCAL_WORLD_SIZE") && getenv("NODE_RANK"), "launcher variables missing");

    /* all_reduce: sum, max, min over f32, f64, i64 */
    enum { N = 1000 };
    float f[N];
    for (int i = 0; i < N; i++) f[i] = (float)(rank + 1) * (float)i;
    OK(cm_comm_all_reduce_sum_f32(c, f, N));
    const float tri = (float)P * (float)(P + 1) / 2.0f;
    for (int i = 0; i < N; i++)
        if (f[i] != tri * (float)i) {
            CHECK(0, "all_reduce f32 [%d] = %g, want %g", i, f[i], tri * (float)i);
            break;
        }
    double d[3] = {rank, 1.5, -rank};
    OK(cm_comm_all_reduce(c, d, 3, CM_COMM_F64, CM_REDUCE_MAX));
    CHECK(d[0] == P - 1 && d[1] == 1.5 && d[2] == 0, "max = (%g, %g, %g), want (%d, 1.5, 0)", d[0], d[1], d[2], P - 1);
    int64_t q = 100 + rank;
    OK(cm_comm_all_reduce(c, &q, 1, CM_COMM_I64, CM_REDUCE_MIN));
    CHECK(q == 100, "min = %lld, want 100", (long long)q);

    /* broadcast from the last rank */
    int32_t b[4] = {rank, rank, rank, rank};
    OK(cm_comm_broadcast(c, b, 4, CM_COMM_I32, P - 1));
    CHECK(b[0] == P - 1 && b[3] == P - 1, "broadcast gave %d, want %d", b[0], P - 1);

    /* reduce_scatter: rank r gets block r of the sum; all_gather puts the blocks back together */
    enum { K = 5 };
    float *send = malloc(sizeof(float) * K * (size_t)P), *all = malloc(sizeof(float) * K * (size_t)P), blk[K];
    for (int i = 0; i < K * P; i++) send[i] = (float)i + (float)rank;
    OK(cm_comm_reduce_scatter(c, send, blk, K, CM_COMM_F32, CM_REDUCE_SUM));
    for (int i = 0; i < K; i++) {
        const float want = (float)P * (float)(rank * K + i) + (float)(P * (P - 1) / 2);
        CHECK(blk[i] == want, "reduce_scatter [%d] = %g, want %g", i, blk[i], want);
    }
    OK(cm_comm_all_gather(c, blk, all, K, CM_COMM_F32));
    for (int i = 0; i < K * P; i++) {
        const float want = (float)P * (float)i + (float)(P * (P - 1) / 2);
        if (all[i] != want) {
            CHECK(0, "all_gather [%d] = %g, want %g", i, all[i], want);
            break;
        }
    }
    free(send);
    free(all);

    /* several non-blocking collectives in flight, waited for in reverse order */
    double x[3][64];
    cm_comm_request *req[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 64; i++) x[k][i] = k + rank;
        OK(cm_comm_iall_reduce(c, x[k], 64, CM_COMM_F64, CM_REDUCE_SUM, &req[k]));
    }
    for (int k = 2; k >= 0; k--) OK(cm_comm_wait(c, req[k]));
    for (int k = 0; k < 3; k++)
        CHECK(x[k][63] == (double)(k * P) + P * (P - 1) / 2.0, "iall_reduce %d = %g", k, x[k][63]);
    cm_comm_request *br;
    OK(cm_comm_ibarrier(c, &br));
    bool done = false;
    while (!done && cm_comm_test(c, br, &done) == CM_OK) {
    }
    CHECK(done, "ibarrier never finished: %s", cm_last_error());

    /* bf16: reductions sum every rank's element in f32 in rank order and round once (the closed
     * form below computes exactly that); all_reduce of counts that do not split evenly (0, 1,
     * fewer than the ranks, a remainder), several in flight at once and waited for in reverse
     * order (their second stage must match whatever order the ranks test them in), MAX too, and
     * a reduce_scatter; gathers move the 16-bit patterns unchanged */
    {
        enum { NB = 1003 };
        const int64_t counts[] = {0, 1, P - 1, 2 * P + 1, NB};
        uint16_t *bb[5];
        cm_comm_request *breq[5];
#define BV(r, i) cm_f32_to_bf16((1.0f + 0.001f * (float)(r) + 0.37f * (float)(i)) * ((i) % 2 ? -1.0f : 1.0f))
        for (int k = 0; k < 5; k++) {
            bb[k] = malloc(sizeof(uint16_t) * (NB + 1));
            for (int64_t i = 0; i < counts[k]; i++) bb[k][i] = BV(rank + k, i);
            OK(cm_comm_iall_reduce(c, bb[k], counts[k], CM_COMM_BF16, k == 3 ? CM_REDUCE_MAX : CM_REDUCE_SUM, &breq[k]));
        }
        for (int k = 4; k >= 0; k--) OK(cm_comm_wait(c, breq[k]));
        for (int k = 0; k < 5; k++) {
            for (int64_t i = 0; i < counts[k]; i++) {
                float acc = cm_bf16_to_f32(BV(k, i));
                for (int o = 1; o < P; o++) {
                    const float v = cm_bf16_to_f32(BV(o + k, i));
                    acc = k == 3 ? (v > acc ? v : acc) : acc + v;
                }
                if (bb[k][i] != cm_f32_to_bf16(acc)) {
                    CHECK(0, "bf16 all_reduce (count %lld) [%lld] = %a, want %a", (long long)counts[k], (long long)i,
                          cm_bf16_to_f32(bb[k][i]), cm_bf16_to_f32(cm_f32_to_bf16(acc)));
                    break;
                }
            }
            free(bb[k]);
        }
        enum { KB = 3 };
        uint16_t *sb = malloc(sizeof(uint16_t) * KB * (size_t)P), rb[KB], *gb = malloc(sizeof(uint16_t) * KB * (size_t)P);
        for (int i = 0; i < KB * P; i++) sb[i] = BV(rank, i);
        OK(cm_comm_reduce_scatter(c, sb, rb, KB, CM_COMM_BF16, CM_REDUCE_SUM));
        for (int i = 0; i < KB; i++) {
            float acc = cm_bf16_to_f32(BV(0, rank * KB + i));
            for (int o = 1; o < P; o++) acc += cm_bf16_to_f32(BV(o, rank * KB + i));
            CHECK(rb[i] == cm_f32_to_bf16(acc), "bf16 reduce_scatter [%d] = %a, want %a", i, cm_bf16_to_f32(rb[i]),
                  cm_bf16_to_f32(cm_f32_to_bf16(acc)));
        }
        OK(cm_comm_all_gather(c, rb, gb, KB, CM_COMM_BF16));
        for (int g = 0; g < P; g++)
            for (int i = 0; i < KB; i++) {
                float acc = cm_bf16_to_f32(BV(0, g * KB + i));
                for (int t = 1; t < P; t++) acc += cm_bf16_to_f32(BV(t, g * KB + i));
                CHECK(gb[g * KB + i] == cm_f32_to_bf16(acc), "bf16 all_gather [%d]", g * KB + i);
            }
#undef BV
        free(sb);
        free(gb);
    }

    /* bad arguments are refused before any rank is involved, and use no sequence number */
    const uint64_t seq = cm_comm_seq(c);
    CHECK(cm_comm_all_reduce(c, f, -1, CM_COMM_F32, CM_REDUCE_SUM) == CM_ERR_INVALID_ARG, "negative count accepted");
    CHECK(cm_comm_broadcast(c, f, 1, CM_COMM_F32, P) == CM_ERR_INVALID_ARG, "root %d accepted", P);
    CHECK(cm_comm_all_reduce(c, NULL, 3, CM_COMM_F32, CM_REDUCE_SUM) == CM_ERR_INVALID_ARG, "NULL buffer accepted");
    CHECK(cm_comm_seq(c) == seq, "refused calls consumed sequence numbers (%llu -> %llu)", (unsigned long long)seq,
          (unsigned long long)cm_comm_seq(c));
    /* every rank made the same number of collectives */
    int64_t s = (int64_t)cm_comm_seq(c), smax = s;
    OK(cm_comm_all_reduce(c, &smax, 1, CM_COMM_I64, CM_REDUCE_MAX));
    CHECK(smax == s, "sequence numbers differ: %lld here, %lld max", (long long)s, (long long)smax);
    OK(cm_comm_barrier(c));

    int total = fails;
    cm_comm_all_reduce(c, &total, 1, CM_COMM_I32, CM_REDUCE_SUM);
    if (rank == 0) printf("dist_collectives: %d ranks, %s\n", P, total ? "FAILED" : "all checks passed");
    cm_comm_free(c);
    return total ? 1 : 0;
}
