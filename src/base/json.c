/* Checked whole numbers out of parsed JSON (json.h). */
#include "base/json.h"

#include <math.h>

#define EXACT_LIMIT 9007199254740992.0 /* 2^53 */

bool cmi_json_whole(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    const double d = v->valuedouble;
    const double dlo = fmax((double)lo, -EXACT_LIMIT), dhi = fmin((double)hi, EXACT_LIMIT);
    if (!(d >= dlo && d <= dhi) || d != floor(d)) return false; /* NaN fails the first test */
    *out = (int64_t)d;
    return true;
}
