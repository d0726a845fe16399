#include <composer/composer.h>
#include <stdio.h>

int main(void) {
    cm_tape *tp;                                   /* records ops for backward; owns activations */
    if (cm_tape_new(NULL, &tp) != CM_OK) return 1;

    int64_t wshape[2] = {10, 784}, xshape[2] = {32, 784}, yshape[1] = {32};
    cm_tensor *w;                                  /* a long-lived parameter */
    cm_tensor_new(CM_DTYPE_F32, 2, wshape, &w);
    cm_rng rng = cm_rng_init(42, 0);
    cm_tensor_init_kaiming_uniform(w, &rng, CM_FAN_IN, 0.0f);
    cm_tensor_set_requires_grad(w, true);

    cm_tensor *x = cm_zeros(tp, CM_DTYPE_F32, 2, xshape);   /* a batch: (32, 784) */
    cm_tensor *y = cm_zeros(tp, CM_DTYPE_I64, 1, yshape);   /* labels:  (32,)     */

    cm_tensor *logits = cm_linear(tp, x, w, NULL);           /* (32, 10) */
    cm_tensor *loss = cm_cross_entropy(tp, logits, y, NULL); /* scalar */
    if (!loss || cm_tape_backward(tp, loss) != CM_OK) {      /* ops chain: check once */
        fprintf(stderr, "error: %s\n", cm_tape_error(tp));
        return 1;
    }
    printf("loss %.4f\n", cm_tensor_get_flat(loss, 0));      /* ln(10) for a zero input */
    /* cm_tensor_grad(w) now holds dloss/dw; update w, then cm_tape_reset(tp) for the next step */

    cm_tensor_free(w);
    cm_tape_free(tp);
    return 0;
}
