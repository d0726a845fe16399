/* The backend lookup and device names: the small part of the device layer that tensor.c needs
 * (kept apart from device.c so the parsers' fuzz targets link tensor.c without the tape). */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <strings.h>

#ifndef CM_HAVE_CUDA
/* A build without the CUDA backend. */
const cmi_backend *cmi_cuda_backend(const char **why) {
    if (why)
        *why = "this build of the library has no CUDA backend (configure with -DCM_CUDA=ON on a machine with the "
               "CUDA toolkit, or -DCM_CUDA=EMU for the emulator)";
    return NULL;
}
#endif

const cmi_backend *cmi_backend_get(cm_device d) { return d == CM_DEVICE_CUDA ? cmi_cuda_backend(NULL) : NULL; }

const char *cm_device_name(cm_device d) {
    return d == CM_DEVICE_CPU ? "cpu" : d == CM_DEVICE_CUDA ? "cuda" : "?";
}

cm_status cm_device_parse(const char *s, cm_device *out) {
    if (s && strcasecmp(s, "cpu") == 0) {
        *out = CM_DEVICE_CPU;
        return CM_OK;
    }
    if (s && (strcasecmp(s, "gpu") == 0 || strcasecmp(s, "cuda") == 0 || strcasecmp(s, "cuda:0") == 0)) {
        *out = CM_DEVICE_CUDA;
        return CM_OK;
    }
    return cm_set_error(CM_ERR_INVALID_ARG, "device '%s' is not known (use cpu, or gpu / cuda for the GPU)",
                        s ? s : "(null)");
}

void cmi_dev_free_data(cm_tensor *t) {
    const cmi_backend *be = cmi_backend_get(t->device);
    if (be) be->free(t->data);
}
