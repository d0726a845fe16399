/* Private: the microbatch-level plumbing MixUp and CutMix share — the pairing of one microbatch,
 * its mixed targets on BEFORE_LOSS, its interpolated loss on BEFORE_BACKWARD. */
#ifndef CM_DA_MIX_H
#define CM_DA_MIX_H

#include "plugins/data_algos/da_impl.h"

typedef struct cmi_da_mix {
    int64_t *perm, cap, n; /* (n) this microbatch's pairing */
    double weight;         /* of the original sample in the targets and the loss */
    const char *input_name, *target_name; /* the fields (borrowed from the batch's names) */
    bool has_box;          /* CutMix: targets with the input's (H, W) get the box pasted instead */
    cm_bbox box;
    int64_t H, W;          /* the input's last two dims (CutMix) */
} cmi_da_mix;

/* BEFORE_FORWARD: finds the input and target fields of the model batch (keys as in data_algos.h),
 * sets n = the input's rows and makes room for perm. *x gets the input tensor. */
cm_status cmi_da_mix_begin(cmi_da_mix *m, cm_state *st, const char *who, const char *input_key, const char *target_key,
                           cm_tensor **x);
/* BEFORE_LOSS: replaces the target with weight·onehot(y) + (1 - weight)·onehot(y[perm]) (or the
 * pasted box, see has_box). */
cm_status cmi_da_mix_targets(cmi_da_mix *m, cm_state *st, const char *who);
/* BEFORE_BACKWARD: loss = weight·loss + (1 - weight)·loss(outputs, y[perm]). */
cm_status cmi_da_mix_loss(cmi_da_mix *m, cm_state *st, const char *who);
void cmi_da_mix_deinit(cmi_da_mix *m);

/* Argument checks of cm_mixup_batch / cm_cutmix_batch: same shape and dtype, contiguous,
 * distinct memory, perm within [0, N). */
cm_status cmi_da_check_pair(const char *who, const cm_tensor *in, const cm_tensor *out, const int64_t *perm);

#endif
