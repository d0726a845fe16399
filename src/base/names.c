/* Name suggestions for error messages ("did you mean ...?"): one edit distance for every layer. */
#include <composer/base.h>

#include <limits.h>
#include <string.h>

int cm_edit_distance(const char *a, const char *b) {
    int prev[64], cur[64];
    int na = (int)strnlen(a, 63), nb = (int)strnlen(b, 63);
    for (int j = 0; j <= nb; j++) prev[j] = j;
    for (int i = 1; i <= na; i++) {
        cur[0] = i;
        for (int j = 1; j <= nb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]), del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (size_t)(nb + 1));
    }
    return prev[nb];
}

const char *cm_closest_name(const char *word, const char *const *cands, int n) {
    if (!word) return NULL;
    const char *best = NULL;
    int bd = INT_MAX;
    for (int i = 0; i < n; i++) {
        if (!cands[i]) continue;
        int d = cm_edit_distance(word, cands[i]);
        if (d < bd) bd = d, best = cands[i];
    }
    int len = (int)strlen(word);
    int limit = len < 6 ? 2 : len / 3 + 1;
    return bd <= limit ? best : NULL;
}
