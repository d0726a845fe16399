/* Allocator hooks (so tests can fail the Nth allocation) and the default aligned allocator. */
#include <composer/base.h>

#include "alloc_impl.h"

#include <stdlib.h>
#include <string.h>

static void *default_alloc(size_t bytes, size_t align, void *data) {
    (void)data;
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (posix_memalign(&p, align, bytes ? bytes : 1) != 0) return NULL;
    return p;
}

static void default_free(void *ptr, void *data) {
    (void)data;
    free(ptr);
}

static const cm_allocator_i k_default = {CM_ALLOCATOR_ABI, default_alloc, default_free, NULL};
static cm_allocator_i g_alloc = {CM_ALLOCATOR_ABI, default_alloc, default_free, NULL};
static int64_t g_fail_at;  /* 0: never; else the allocation number that fails */
static int64_t g_count;    /* allocations since the last cm_alloc_fail_at */

void cm_set_allocator(const cm_allocator_i *a) { g_alloc = a ? *a : k_default; }

int64_t cm_alloc_fail_at(int64_t n) {
    int64_t made = __atomic_exchange_n(&g_count, 0, __ATOMIC_ACQ_REL);
    __atomic_store_n(&g_fail_at, n, __ATOMIC_RELEASE);
    return made;
}

bool cmi_alloc_tick(size_t bytes) {
    int64_t k = __atomic_add_fetch(&g_count, 1, __ATOMIC_ACQ_REL);
    int64_t f = __atomic_load_n(&g_fail_at, __ATOMIC_ACQUIRE);
    if (f > 0 && k == f) {
        cm_set_error(CM_ERR_OOM, "out of memory: allocation of %zu bytes failed (injected failure #%lld)", bytes,
                     (long long)k);
        return false;
    }
    return true;
}

bool cmi_alloc_is_default(void) { return g_alloc.alloc == default_alloc && g_alloc.free == default_free; }

void *cm_alloc(size_t bytes, size_t align) {
    if (!cmi_alloc_tick(bytes)) return NULL;
    void *p = g_alloc.alloc(bytes, align, g_alloc.data);
    if (!p) cm_set_error(CM_ERR_OOM, "out of memory: allocation of %zu bytes failed", bytes);
    return p;
}

void *cm_alloc_zeroed(size_t bytes, size_t align) {
    void *p = cm_alloc(bytes, align);
    if (p) memset(p, 0, bytes);
    return p;
}

void cm_free(void *ptr) {
    if (ptr) g_alloc.free(ptr, g_alloc.data);
}
