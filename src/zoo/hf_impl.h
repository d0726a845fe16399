/* Private: the pieces of composer/hf.h that the HuggingFaceCheckpointer and the checkpoint export
 * (src/plugins/hf_checkpointer.c) share with cm_hf_save. */
#ifndef CM_HF_IMPL_H
#define CM_HF_IMPL_H

#include <composer/hf.h>

/* mkdir -p; CM_ERR_IO naming the component that failed. */
cm_status cmi_hf_mkdirs(const char *path);

/* Writes a pretrained folder into dir (which must exist): config.json (config_json, as given), the
 * model's weights as model.safetensors when m is not NULL (a stale model.safetensors.index.json is
 * removed, so loaders take the new file), and the files[0, n) (tokenizer files). Each file is
 * written atomically. Errors: CM_ERR_IO naming the path, the writer's. */
cm_status cmi_hf_write(const char *dir, const char *config_json, cm_model *m, const cm_hf_file *files, int n);

#endif
