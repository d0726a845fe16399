/* What the arena needs from the allocator hooks beyond cm_alloc (src/base only). */
#ifndef CM_BASE_ALLOC_IMPL_H
#define CM_BASE_ALLOC_IMPL_H

#include <stdbool.h>
#include <stddef.h>

/* Counts one allocation of `bytes` for cm_alloc_fail_at: false, with CM_ERR_OOM recorded, when it
 * is the injected failure. cm_alloc calls it; so does memory taken outside the hooks. */
bool cmi_alloc_tick(size_t bytes);

/* Whether the hooks are the default ones (no cm_set_allocator in effect): only then may memory be
 * taken outside them (the arena's address-space reservation) without a user's hooks missing it. */
bool cmi_alloc_is_default(void);

#endif
