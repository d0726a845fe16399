/* Strided n-d iteration with broadcasting, and the shape helpers built on it. */
#include "tensor/tensor_impl.h"

bool cmi_broadcast_shapes(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout, int64_t *sout) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        sout[i] = da == 1 ? db : da;
    }
    *nout = n;
    return true;
}

void cmi_broadcast_strides(const cm_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    for (int i = 0; i < ndim; i++) {
        int it = i - (ndim - t->ndim);
        stride[i] = (it < 0 || (t->shape[it] == 1 && shape[i] != 1)) ? 0 : t->stride[it];
    }
}

void cmi_iterate(int ndim, const int64_t *shape, int n_ops, int64_t (*strides)[CM_MAX_DIMS], char *const *bases,
                 const size_t *esize, bool parallel, cmi_row_fn fn, void *ctx) {
    int64_t sh[CM_MAX_DIMS + 1];
    int64_t st[4][CM_MAX_DIMS + 1];
    int nd = 0;
    /* Drop size-1 dims, then merge dim i into i+1 when every operand is contiguous across them. */
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) return;
        if (shape[i] == 1) continue;
        sh[nd] = shape[i];
        for (int k = 0; k < n_ops; k++) st[k][nd] = strides[k][i];
        nd++;
    }
    if (nd == 0) {
        sh[0] = 1;
        for (int k = 0; k < n_ops; k++) st[k][0] = 0;
        nd = 1;
    }
    int m = 0;
    for (int i = 1; i < nd; i++) {
        bool merge = true;
        for (int k = 0; k < n_ops; k++)
            if (st[k][m] != st[k][i] * sh[i]) merge = false;
        if (merge) {
            sh[m] *= sh[i];
            for (int k = 0; k < n_ops; k++) st[k][m] = st[k][i];
        } else {
            m++;
            sh[m] = sh[i];
            for (int k = 0; k < n_ops; k++) st[k][m] = st[k][i];
        }
    }
    nd = m + 1;
    const int64_t inner_n = sh[nd - 1];
    int64_t inner[4];
    for (int k = 0; k < n_ops; k++) inner[k] = st[k][nd - 1];
    int64_t rows = 1;
    for (int i = 0; i < nd - 1; i++) rows *= sh[i];
    bool par = parallel && rows > 1 && rows * inner_n >= CMI_PAR_MIN;
#pragma omp parallel for if (par) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        char *p[4];
        int64_t rem = r;
        for (int k = 0; k < n_ops; k++) p[k] = bases[k];
        for (int i = nd - 2; i >= 0; i--) {
            int64_t idx = rem % sh[i];
            rem /= sh[i];
            for (int k = 0; k < n_ops; k++) p[k] += idx * st[k][i] * (int64_t)esize[k];
        }
        fn(inner_n, p, inner, ctx);
    }
}
