/* The backend lookup and device names: the small part of the device layer that tensor.c needs
 * (kept apart from device.c so the parsers' fuzz targets link tensor.c without the tape). */
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

#include <string.h>
#include <strings.h>

#ifndef CM_HAVE_CUDA
/* A build without the CUDA backend. */
const cmi_backend *cmi_cuda_backend(const char **why) {
    if (why)
        *why = "this build of the library has no CUDA backend (configure with -DCM_CUDA=ON on a machine with the "
               "CUDA toolkit, or -DCM_CUDA=EMU for the emulator)";
    return NULL;
}

cm_status cmi_cuda_blas_load(const char **from) {
    if (from) *from = NULL;
    return cm_set_error(CM_ERR_UNSUPPORTED, "this build of the library has no CUDA backend");
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

void *cmi_dev_alloc(cm_device d, size_t bytes, bool zero) {
    if (d == CM_DEVICE_CPU) return zero ? cm_alloc_zeroed(bytes ? bytes : 64, 64) : cm_alloc(bytes ? bytes : 64, 64);
    const cmi_backend *be = cmi_backend_get(d);
    if (!be) {
        cm_set_error(CM_ERR_UNSUPPORTED, "device %s: no backend in this build", cm_device_name(d));
        return NULL;
    }
    if (be->init() != CM_OK) return NULL;
    void *p = be->alloc(bytes ? bytes : 64);
    if (p && zero && be->memset(p, 0, bytes) != CM_OK) {
        be->free(p);
        return NULL;
    }
    return p;
}

void cmi_dev_free(cm_device d, void *p) {
    if (!p) return;
    if (d == CM_DEVICE_CPU) cm_free(p);
    else cmi_backend_get(d)->free(p);
}

cm_status cmi_dev_memcpy(void *dst, cm_device dd, const void *src, cm_device sd, size_t bytes) {
    if (!bytes) return CM_OK;
    if (dd == CM_DEVICE_CPU && sd == CM_DEVICE_CPU) {
        memcpy(dst, src, bytes);
        return CM_OK;
    }
    if (dd != CM_DEVICE_CPU && sd != CM_DEVICE_CPU && dd != sd)
        return cm_set_error(CM_ERR_UNSUPPORTED, "copy between two devices (%s, %s)", cm_device_name(sd),
                            cm_device_name(dd));
    const cmi_backend *be = cmi_backend_get(dd != CM_DEVICE_CPU ? dd : sd);
    return be->memcpy(dst, src, bytes, dd == CM_DEVICE_CPU ? CMI_D2H : sd == CM_DEVICE_CPU ? CMI_H2D : CMI_D2D);
}

cm_status cmi_dev_memset(cm_device d, void *p, int v, size_t bytes) {
    if (d == CM_DEVICE_CPU) {
        memset(p, v, bytes);
        return CM_OK;
    }
    return cmi_backend_get(d)->memset(p, v, bytes);
}

cm_device cmi_ptr_device(const void *p) {
    if (!p) return CM_DEVICE_CPU;
    const cmi_backend *be = cmi_backend_get(CM_DEVICE_CUDA);
    return be && be->owns(p) ? CM_DEVICE_CUDA : CM_DEVICE_CPU;
}
