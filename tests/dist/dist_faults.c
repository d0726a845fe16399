/* Faults on purpose, to check that the job ends with a clear message instead of hanging:
 *
 *   dist_faults skip    the last rank skips all_reduce #3 and leaves; the others time out
 *                       (CM_DIST_TIMEOUT, status CM_ERR_TIMEOUT) and report which rank is missing
 *                       from which collective
 *   dist_faults kill    rank 1 kills itself (SIGKILL) before all_reduce #3
 *   dist_faults crash   rank 1 fails with an error message and exit status 3 before #3
 *
 * Every rank that sees an error prints it ("error (CM_ERR_...): message") and exits 1. */
#include <composer/composer.h>
#include <composer/dist.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    cm_comm *c;
    if (cm_comm_auto_new(NULL, &c) != CM_OK) {
        fprintf(stderr, "comm: %s\n", cm_last_error());
        return 1;
    }
    const int rank = cm_comm_rank(c), P = cm_comm_size(c);
    float x[256] = {0};
    for (int k = 1; k <= 5; k++) {
        if (k == 3) {
            if (!strcmp(mode, "skip") && rank == P - 1) {
                fprintf(stderr, "rank %d: skipping all_reduce #3 on purpose\n", rank);
                cm_comm_free(c);
                return 0;
            }
            if (!strcmp(mode, "kill") && rank == 1) raise(SIGKILL);
            if (!strcmp(mode, "crash") && rank == 1) {
                fprintf(stderr, "rank 1: simulated failure: cannot read shard 7 (on purpose)\n");
                return 3;
            }
        }
        cm_status s = cm_comm_all_reduce_sum_f32(c, x, 256);
        if (s != CM_OK) {
            fprintf(stderr, "error (%s): %s\n", cm_status_name(s), cm_last_error());
            cm_comm_free(c); /* a failed communicator is not finalised: this returns at once */
            return 1;
        }
    }
    cm_comm_free(c);
    return 0;
}
