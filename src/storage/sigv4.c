/* AWS Signature Version 4: the canonical request, the string to sign, the signing key chain and
 * the Authorization header, as AWS's "Signature Version 4 signing process" describes them (and its
 * test suite checks: tests/test_storage.c). SHA-256 and HMAC come from OpenSSL's libcrypto. */
#define _GNU_SOURCE
#include "storage/storage_impl.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cmi_sha256(const void *data, size_t n, uint8_t out[32]) {
    unsigned int len = 32;
    EVP_Digest(data, n, out, &len, EVP_sha256(), NULL);
}

static void to_hex(const uint8_t *b, size_t n, char *hex) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) hex[2 * i] = d[b[i] >> 4], hex[2 * i + 1] = d[b[i] & 15];
    hex[2 * n] = 0;
}

void cmi_sha256_hex(const void *data, size_t n, char hex[65]) {
    uint8_t h[32];
    cmi_sha256(data, n, h);
    to_hex(h, 32, hex);
}

void cmi_hmac_sha256(const void *key, size_t klen, const void *data, size_t n, uint8_t out[32]) {
    unsigned int len = 32;
    HMAC(EVP_sha256(), key, (int)klen, data, n, out, &len);
}

static bool unreserved(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
           c == '_' || c == '~';
}

bool cmi_uri_encode(const char *s, bool keep_slash, char *out, size_t cap) {
    static const char d[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (unreserved(*p) || (keep_slash && *p == '/')) {
            if (o + 2 > cap) return false;
            out[o++] = (char)*p;
        } else {
            if (o + 4 > cap) return false;
            out[o++] = '%', out[o++] = d[*p >> 4], out[o++] = d[*p & 15];
        }
    }
    if (o + 1 > cap) return false;
    out[o] = 0;
    return true;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes %XX in place (a '+' stays a '+': AWS does not read it as a space). */
static void uri_decode(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        int a, b;
        if (*p == '%' && (a = hexval(p[1])) >= 0 && (b = hexval(p[2])) >= 0) {
            *o++ = (char)(a * 16 + b);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
}

/* A growing string. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = cm_alloc(nc, 1);
        if (!np) {
            b->oom = true;
            return;
        }
        if (b->p) memcpy(np, b->p, b->n);
        cm_free(b->p);
        b->p = np, b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

typedef struct qparam {
    char *k, *v; /* encoded */
} qparam;

static int qcmp(const void *a, const void *b) {
    const qparam *x = a, *y = b;
    int c = strcmp(x->k, y->k);
    return c ? c : strcmp(x->v, y->v);
}

typedef struct hdr {
    char *name, *value;
} hdr;

static int hcmp(const void *a, const void *b) { return strcmp(((const hdr *)a)->name, ((const hdr *)b)->name); }

/* The canonical query string: every key=value decoded, re-encoded, sorted. */
static bool canonical_query(const char *q, sbuf *out) {
    if (!q || !*q) return true;
    size_t n = 1;
    for (const char *p = q; *p; p++) n += *p == '&';
    qparam *ps = cm_alloc_zeroed(sizeof *ps * n, 16);
    char *copy = cm_alloc(strlen(q) + 1, 1);
    bool ok = ps && copy;
    size_t k = 0;
    if (ok) {
        strcpy(copy, q);
        char *save = NULL;
        for (char *tok = strtok_r(copy, "&", &save); ok && tok; tok = strtok_r(NULL, "&", &save)) {
            char *eq = strchr(tok, '=');
            const char *val = "";
            if (eq) *eq = 0, val = eq + 1;
            char *kd = cm_alloc(strlen(tok) + 1, 1), *vd = cm_alloc(strlen(val) + 1, 1);
            size_t kc = 3 * strlen(tok) + 1, vc = 3 * strlen(val) + 1;
            ps[k].k = cm_alloc(kc, 1), ps[k].v = cm_alloc(vc, 1);
            if (!kd || !vd || !ps[k].k || !ps[k].v) {
                cm_free(kd), cm_free(vd);
                ok = false;
                k++;
                break;
            }
            strcpy(kd, tok), strcpy(vd, val);
            uri_decode(kd), uri_decode(vd);
            cmi_uri_encode(kd, false, ps[k].k, kc);
            cmi_uri_encode(vd, false, ps[k].v, vc);
            cm_free(kd), cm_free(vd);
            k++;
        }
    }
    if (ok) {
        qsort(ps, k, sizeof *ps, qcmp);
        for (size_t i = 0; i < k; i++) {
            if (i) sb_add(out, "&");
            sb_add(out, ps[i].k);
            sb_add(out, "=");
            sb_add(out, ps[i].v);
        }
    }
    for (size_t i = 0; ps && i < n; i++) cm_free(ps[i].k), cm_free(ps[i].v);
    cm_free(ps);
    cm_free(copy);
    return ok && !out->oom;
}

/* A header value trimmed, with inner runs of spaces collapsed to one. */
static char *canon_value(const char *v) {
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    char *o = cm_alloc(n + 1, 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool sp = v[i] == ' ' || v[i] == '\t';
        if (sp && k && o[k - 1] == ' ') continue;
        o[k++] = sp ? ' ' : v[i];
    }
    o[k] = 0;
    return o;
}

cm_status cmi_sigv4_sign(const cmi_sigv4_request *r, char *auth, size_t cap, char *creq, size_t creq_cap, char *sts,
                         size_t sts_cap) {
    if (!r || !r->method || !r->path || !r->payload_sha256 || !r->region || !r->service || !r->amz_date ||
        !r->access_key || !r->secret_key || strlen(r->amz_date) != 16 || !auth)
        return cm_set_error(CM_ERR_INVALID_ARG, "SigV4: a request field is missing or the date is not YYYYMMDDTHHMMSSZ");
    hdr *hs = cm_alloc_zeroed(sizeof *hs * (size_t)(r->n_headers + 1), 16);
    sbuf c = {0}, signed_h = {0}, s2s = {0};
    cm_status st = hs ? CM_OK : CM_ERR_OOM;
    for (int i = 0; !st && i < r->n_headers; i++) {
        size_t nl = strlen(r->headers[i].name);
        hs[i].name = cm_alloc(nl + 1, 1);
        hs[i].value = canon_value(r->headers[i].value);
        if (!hs[i].name || !hs[i].value) {
            st = CM_ERR_OOM;
            break;
        }
        for (size_t j = 0; j <= nl; j++) hs[i].name[j] = (char)tolower((unsigned char)r->headers[i].name[j]);
    }
    if (!st) qsort(hs, (size_t)r->n_headers, sizeof *hs, hcmp);
    /* canonical request */
    if (!st) {
        sb_add(&c, r->method);
        sb_add(&c, "\n");
        sb_add(&c, r->path[0] ? r->path : "/");
        sb_add(&c, "\n");
        if (!canonical_query(r->query, &c)) st = CM_ERR_OOM;
        sb_add(&c, "\n");
        for (int i = 0; i < r->n_headers; i++) {
            sb_add(&c, hs[i].name);
            sb_add(&c, ":");
            sb_add(&c, hs[i].value);
            sb_add(&c, "\n");
            if (i) sb_add(&signed_h, ";");
            sb_add(&signed_h, hs[i].name);
        }
        sb_add(&c, "\n");
        sb_add(&c, signed_h.p ? signed_h.p : "");
        sb_add(&c, "\n");
        sb_add(&c, r->payload_sha256);
        if (c.oom || signed_h.oom) st = CM_ERR_OOM;
    }
    char date[9], scope[256], chash[65];
    if (!st) {
        memcpy(date, r->amz_date, 8);
        date[8] = 0;
        snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", date, r->region, r->service);
        cmi_sha256_hex(c.p, c.n, chash);
        sb_add(&s2s, "AWS4-HMAC-SHA256\n");
        sb_add(&s2s, r->amz_date);
        sb_add(&s2s, "\n");
        sb_add(&s2s, scope);
        sb_add(&s2s, "\n");
        sb_add(&s2s, chash);
        if (s2s.oom) st = CM_ERR_OOM;
    }
    if (!st) {
        /* kDate = HMAC("AWS4" + secret, date), kRegion, kService, kSigning = HMAC(kService, "aws4_request") */
        size_t sl = strlen(r->secret_key);
        char *k0 = cm_alloc(sl + 5, 1);
        if (!k0) {
            st = CM_ERR_OOM;
        } else {
            uint8_t k1[32], k2[32], k3[32], k4[32], sig[32];
            memcpy(k0, "AWS4", 4);
            memcpy(k0 + 4, r->secret_key, sl + 1);
            cmi_hmac_sha256(k0, sl + 4, date, 8, k1);
            cm_free(k0);
            cmi_hmac_sha256(k1, 32, r->region, strlen(r->region), k2);
            cmi_hmac_sha256(k2, 32, r->service, strlen(r->service), k3);
            cmi_hmac_sha256(k3, 32, "aws4_request", 12, k4);
            cmi_hmac_sha256(k4, 32, s2s.p, s2s.n, sig);
            char sighex[65];
            to_hex(sig, 32, sighex);
            int w = snprintf(auth, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                             r->access_key, scope, signed_h.p ? signed_h.p : "", sighex);
            if (w < 0 || (size_t)w >= cap) st = cm_set_error(CM_ERR_INVALID_ARG, "SigV4: the Authorization buffer is too small");
        }
    }
    if (!st && creq) {
        if (c.n + 1 > creq_cap) st = cm_set_error(CM_ERR_INVALID_ARG, "SigV4: the canonical request buffer is too small");
        else memcpy(creq, c.p, c.n + 1);
    }
    if (!st && sts) {
        if (s2s.n + 1 > sts_cap) st = cm_set_error(CM_ERR_INVALID_ARG, "SigV4: the string-to-sign buffer is too small");
        else memcpy(sts, s2s.p, s2s.n + 1);
    }
    for (int i = 0; hs && i < r->n_headers; i++) cm_free(hs[i].name), cm_free(hs[i].value);
    cm_free(hs);
    cm_free(c.p), cm_free(signed_h.p), cm_free(s2s.p);
    if (st == CM_ERR_OOM) return cm_set_error(CM_ERR_OOM, "SigV4: out of memory");
    return st;
}
