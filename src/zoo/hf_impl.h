/* Private: the pieces of composer/hf.h that the HuggingFaceCheckpointer and the checkpoint export
 * (src/plugins/hf_checkpointer.c) share with cm_hf_save. */
#ifndef CM_HF_IMPL_H
#define CM_HF_IMPL_H

#include <composer/hf.h>

/* mkdir -p; CM_ERR_IO naming the component that failed. */
cm_status cmi_hf_mkdirs(const char *path);

/* CM_OK when m (a BERT or GPT-2 zoo model) is what its config.json says: no attention with ALiBi and
 * no module of a type the plain model of its class lacks (model surgery: gated linear units,
 * factorized layers; GyroDropout's dropout layers are allowed — no weights, training only).
 * Otherwise CM_ERR_UNSUPPORTED naming the module, why the folder would be another model, and the
 * fix (fine-tune from the Composer checkpoint). */
cm_status cmi_hf_check_plain(const cm_model *m);
/* Whether a folder keeps what the required_on_load method `algorithm` (class name) does to a model,
 * as cmi_hf_check_plain judges the model: true for the low-precision norms and GyroDropout. */
bool cmi_hf_folder_keeps(const char *algorithm);

/* Writes a pretrained folder into dir (which must exist): config.json (config_json, as given), the
 * model's weights as model.safetensors when m is not NULL (a stale model.safetensors.index.json is
 * removed, so loaders take the new file), and the files[0, n) (tokenizer files). Each file is
 * written atomically; a model cmi_hf_check_plain refuses writes nothing. Errors: CM_ERR_IO naming
 * the path, cmi_hf_check_plain's, the writer's. */
cm_status cmi_hf_write(const char *dir, const char *config_json, cm_model *m, const cm_hf_file *files, int n);

#endif
