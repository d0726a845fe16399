/* The storage layer: SigV4 against AWS's published vectors; the same battery of operations on a
 * local folder, a file:// URI and a real S3-compatible server (s3rver on loopback, behind a proxy
 * that checks every signature with an independent signer); wrong keys refused; faults (HTTP 500s,
 * slow responses, connections cut mid-download, the server stopped mid-upload) retried without
 * losing a byte, and permanent errors reported at once with the URI. */
#define _GNU_SOURCE
#include "cms3.h"
#include "cmtest.h"
#include "storage/storage_impl.h"

#include <composer/storage.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * SigV4 vectors
 * ------------------------------------------------------------------------------------------- */

/* AWS Signature Version 4 test suite (aws-sig-v4-test-suite, 2015-08-30 edition, as mirrored in
 * bazelbuild/bazel third_party/aws-sig-v4-test-suite/): credentials AKIDEXAMPLE /
 * wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY, region us-east-1, service "service",
 * X-Amz-Date 20150830T123600Z. Each case: the request (<name>.req) and the expected Authorization
 * header (<name>.authz). */
#define SUITE_KEY "AKIDEXAMPLE"
#define SUITE_SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define SUITE_DATE "20150830T123600Z"

typedef struct vec {
    const char *name, *method, *path, *query, *body;
    cmi_sigv4_header h[4];
    int nh;
    const char *authz;
} vec;

static void check_vec(const vec *v, const char *key, const char *secret, const char *region, const char *service,
                      const char *date, const char *payload) {
    char auth[1024], creq[4096], sts[1024], ph[65];
    if (!payload) {
        cmi_sha256_hex(v->body ? v->body : "", v->body ? strlen(v->body) : 0, ph);
        payload = ph;
    }
    cmi_sigv4_request r = {v->method, v->path, v->query, v->h, v->nh, payload, region, service, date, key, secret};
    cr_assert_eq(cmi_sigv4_sign(&r, auth, sizeof auth, creq, sizeof creq, sts, sizeof sts), CM_OK, "%s: %s", v->name,
                 cm_last_error());
    cr_assert_str_eq(auth, v->authz, "%s:\n got  %s\n want %s\ncanonical request:\n%s\nstring to sign:\n%s", v->name,
                     auth, v->authz, creq, sts);
}

Test(storage_sigv4, matches_the_aws_signature_v4_test_suite) {
    const vec vs[] = {
        {"get-vanilla-query-order-key-case", "GET", "/", "Param2=value2&Param1=value1", NULL,
         {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", SUITE_DATE}}, 2,
         "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, "
         "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"},
        {"get-vanilla-utf8-query", "GET", "/", "\xe1\x88\xb4=bar", NULL,
         {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", SUITE_DATE}}, 2,
         "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, "
         "Signature=2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"},
        {"get-unreserved", "GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", NULL, NULL,
         {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", SUITE_DATE}}, 2,
         "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, "
         "Signature=07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"},
        {"get-header-value-trim", "GET", "/", NULL, NULL,
         {{"Host", "example.amazonaws.com"}, {"My-Header1", " value1"}, {"My-Header2", " \"a   b   c\""},
          {"X-Amz-Date", SUITE_DATE}},
         4,
         "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
         "SignedHeaders=host;my-header1;my-header2;x-amz-date, "
         "Signature=acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"},
        {"post-x-www-form-urlencoded", "POST", "/", NULL, "Param1=value1",
         {{"Content-Type", "application/x-www-form-urlencoded"}, {"Host", "example.amazonaws.com"},
          {"X-Amz-Date", SUITE_DATE}},
         3,
         "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
         "SignedHeaders=content-type;host;x-amz-date, "
         "Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"},
        {"post-sts-header-before", "POST", "/", NULL, NULL,
         {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", SUITE_DATE},
          {"X-Amz-Security-Token",
           "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8Y"
           "UuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6f"
           "E8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2"
           "ICCR/oLxBA=="}},
         3,
         "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
         "SignedHeaders=host;x-amz-date;x-amz-security-token, "
         "Signature=85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"},
    };
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++)
        check_vec(&vs[i], SUITE_KEY, SUITE_SECRET, "us-east-1", "service", SUITE_DATE, NULL);
    /* the intermediate steps of one case (.creq and .sts of post-x-www-form-urlencoded) */
    char auth[1024], creq[2048], sts[1024], ph[65];
    cmi_sha256_hex("Param1=value1", 13, ph);
    cmi_sigv4_request r = {"POST", "/", NULL, vs[4].h, 3, ph, "us-east-1", "service", SUITE_DATE, SUITE_KEY, SUITE_SECRET};
    cr_assert_eq(cmi_sigv4_sign(&r, auth, sizeof auth, creq, sizeof creq, sts, sizeof sts), CM_OK);
    cr_assert_str_eq(creq, "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n"
                           "x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n"
                           "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e");
    cr_assert_str_eq(sts, "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
                          "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281");
}

/* The S3 examples of AWS's "Signature Calculations for the Authorization Header: Transferring
 * Payload in a Single Chunk" (Amazon S3 API reference, sig-v4-header-based-auth): credentials
 * AKIAIOSFODNN7EXAMPLE / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY, us-east-1, 20130524T000000Z,
 * bucket examplebucket, virtual-host style, x-amz-content-sha256 signed. */
Test(storage_sigv4, matches_the_aws_s3_documentation_examples) {
#define S3K "AKIAIOSFODNN7EXAMPLE"
#define S3S "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define S3D "20130524T000000Z"
#define HOST "examplebucket.s3.amazonaws.com"
#define EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    char welcome[65];
    cmi_sha256_hex("Welcome to Amazon S3.", 21, welcome);
    cr_assert_str_eq(welcome, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
    /* the key "test$file.text" as our client puts it in the path */
    char path[64];
    cr_assert(cmi_uri_encode("/test$file.text", true, path, sizeof path));
    cr_assert_str_eq(path, "/test%24file.text");
    const vec get = {"GET Object", "GET", "/test.txt", NULL, NULL,
                     {{"Host", HOST}, {"Range", "bytes=0-9"}, {"x-amz-content-sha256", EMPTY}, {"x-amz-date", S3D}}, 4,
                     "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                     "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                     "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"};
    check_vec(&get, S3K, S3S, "us-east-1", "s3", S3D, EMPTY);
    vec put = {"PUT Object", "PUT", path, NULL, NULL,
               {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"Host", HOST}, {"x-amz-date", S3D},
                {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
               4, NULL};
    /* five headers: x-amz-content-sha256 too */
    cmi_sigv4_header ph[5] = {put.h[0], put.h[1], {"x-amz-content-sha256", welcome}, put.h[2], put.h[3]};
    char auth[1024];
    cmi_sigv4_request r = {"PUT", path, NULL, ph, 5, welcome, "us-east-1", "s3", S3D, S3K, S3S};
    cr_assert_eq(cmi_sigv4_sign(&r, auth, sizeof auth, NULL, 0, NULL, 0), CM_OK);
    cr_assert_str_eq(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                           "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, "
                           "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
    const vec lifecycle = {"GET Bucket Lifecycle", "GET", "/", "lifecycle", NULL,
                           {{"Host", HOST}, {"x-amz-content-sha256", EMPTY}, {"x-amz-date", S3D}}, 3,
                           "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                           "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
                           "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"};
    check_vec(&lifecycle, S3K, S3S, "us-east-1", "s3", S3D, EMPTY);
    /* ListObjects with the parameters out of order: the canonical query sorts them */
    const vec list = {"Get Bucket (List Objects)", "GET", "/", "prefix=J&max-keys=2", NULL,
                      {{"Host", HOST}, {"x-amz-content-sha256", EMPTY}, {"x-amz-date", S3D}}, 3,
                      "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                      "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
                      "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"};
    check_vec(&list, S3K, S3S, "us-east-1", "s3", S3D, EMPTY);
    /* one byte of the secret changes everything */
    vec wrong = list;
    char a2[1024];
    cmi_sigv4_request r2 = {"GET", "/", "prefix=J&max-keys=2", list.h, 3, EMPTY, "us-east-1", "s3", S3D, S3K,
                            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEZ"};
    cr_assert_eq(cmi_sigv4_sign(&r2, a2, sizeof a2, NULL, 0, NULL, 0), CM_OK);
    cr_assert_str_neq(a2, wrong.authz);
}

/* ---------------------------------------------------------------------------------------------
 * The battery, on every kind of store
 * ------------------------------------------------------------------------------------------- */

static void fill(char *buf, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        buf[i] = (char)(x >> 24);
    }
}

static void assert_file_is(const char *path, const char *want, size_t n) {
    size_t got;
    char *b = cmt_read_file(path, &got);
    cr_assert_eq(got, n, "%s has %zu bytes, want %zu", path, got, n);
    cr_assert(memcmp(b, want, n) == 0, "%s: the bytes differ", path);
    free(b);
}

static char g_tmp[256];

static void tmp_setup(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/cm-storage-XXXXXX");
    cr_assert(mkdtemp(g_tmp));
}

static void tmp_teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    (void)!system(cmd);
}

/* put/get, small and multipart uploads, downloads, sizes, listings (several pages on S3), deletes,
 * keys that need encoding, and the not-found errors. */
static void battery(const char *uri, const cm_object_store_config *cfg, size_t big) {
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open(uri, cfg, &st), CM_OK, "%s", cm_last_error());
    cr_assert_str_eq(cm_object_store_uri(st), uri);
    const char *hello = "hello, store";
    cr_assert_eq(cm_object_store_put(st, "a/hello.txt", hello, strlen(hello)), CM_OK, "%s", cm_last_error());
    char *got;
    size_t n;
    cr_assert_eq(cm_object_store_get(st, "a/hello.txt", 100, &got, &n), CM_OK, "%s", cm_last_error());
    cr_assert_eq(n, strlen(hello));
    cr_assert_str_eq(got, hello);
    cm_free(got);
    cr_assert_eq(cm_object_store_get(st, "a/hello.txt", 4, &got, &n), CM_ERR_FORMAT, "a too-large object is refused");
    cr_assert_eq(cm_object_store_put(st, "a/empty", "", 0), CM_OK, "%s", cm_last_error());
    uint64_t sz = 1;
    cr_assert_eq(cm_object_store_get_size(st, "a/empty", &sz), CM_OK, "%s", cm_last_error());
    cr_assert_eq(sz, 0);

    /* a file larger than the part size: multipart on S3 */
    char *data = malloc(big);
    fill(data, big, 7);
    char src[300], dst[300];
    snprintf(src, sizeof src, "%s/src.bin", g_tmp);
    cmt_write_file(src, data, big);
    const char *odd = "b/sp ace+plus/\xc3\xa9t\xc3\xa9 (1)~.bin"; /* needs encoding */
    cr_assert_eq(cm_object_store_upload(st, odd, src), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_object_store_get_size(st, odd, &sz), CM_OK, "%s", cm_last_error());
    cr_assert_eq(sz, big, "size %llu, want %zu", (unsigned long long)sz, big);
    snprintf(dst, sizeof dst, "%s/down/deeper/copy.bin", g_tmp);
    cr_assert_eq(cm_object_store_download(st, odd, dst), CM_OK, "%s", cm_last_error());
    assert_file_is(dst, data, big);
    cr_assert_eq(cm_object_store_download(st, "a/empty", dst), CM_OK, "%s", cm_last_error());
    assert_file_is(dst, "", 0);

    /* listings: by prefix, all, none; sorted; keys relative to the store */
    for (int i = 0; i < 5; i++) {
        char k[64];
        snprintf(k, sizeof k, "list/item-%d", 4 - i);
        cr_assert_eq(cm_object_store_put(st, k, k, strlen(k)), CM_OK, "%s", cm_last_error());
    }
    cm_object_list l;
    cr_assert_eq(cm_object_store_list(st, "list/", &l), CM_OK, "%s", cm_last_error());
    cr_assert_eq(l.n, 5, "listed %zu", l.n);
    for (size_t i = 0; i < l.n; i++) {
        char k[64];
        snprintf(k, sizeof k, "list/item-%zu", i);
        cr_assert_str_eq(l.items[i].key, k);
        cr_assert_eq(l.items[i].size, strlen(k));
    }
    cm_object_list_free(&l);
    cr_assert_eq(cm_object_store_list(st, "", &l), CM_OK, "%s", cm_last_error());
    cr_assert_eq(l.n, 8, "all objects: %zu", l.n);
    cr_assert_str_eq(l.items[0].key, "a/empty");
    cr_assert_str_eq(l.items[2].key, odd);
    cr_assert_eq(l.items[2].size, big);
    cm_object_list_free(&l);
    cr_assert_eq(cm_object_store_list(st, "nothing-here/", &l), CM_OK, "%s", cm_last_error());
    cr_assert_eq(l.n, 0);
    cm_object_list_free(&l);

    /* deletes, and deleting what is gone */
    cr_assert_eq(cm_object_store_delete(st, "list/item-2"), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_object_store_delete(st, "list/item-2"), CM_OK, "deleting twice: %s", cm_last_error());
    cr_assert_eq(cm_object_store_list(st, "list/", &l), CM_OK);
    cr_assert_eq(l.n, 4);
    cm_object_list_free(&l);

    /* not found: a clear error naming the object's URI */
    char want[512];
    snprintf(want, sizeof want, "%s/list/item-2", uri);
    cr_assert_eq(cm_object_store_get_size(st, "list/item-2", &sz), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), want), "message: %s", cm_last_error());
    cr_assert_eq(cm_object_store_download(st, "list/item-2", dst), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), want), "message: %s", cm_last_error());
    assert_file_is(dst, "", 0); /* the earlier download at that path is untouched */
    cr_assert_eq(cm_object_store_get(st, "list/item-2", 10, &got, &n), CM_ERR_NOT_FOUND);
    /* bad keys */
    cr_assert_eq(cm_object_store_put(st, "/abs", "x", 1), CM_ERR_INVALID_ARG);
    cr_assert_eq(cm_object_store_put(st, "a/../../escape", "x", 1), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "'..'"), "message: %s", cm_last_error());
    cr_assert_eq(cm_object_store_upload(st, "x", "/nonexistent/file"), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "/nonexistent/file"), "message: %s", cm_last_error());
    free(data);
    cm_object_store_close(st);
}

Test(storage_local, battery_on_a_folder_and_a_file_uri, .init = tmp_setup, .fini = tmp_teardown) {
    char uri[300];
    snprintf(uri, sizeof uri, "%s/store", g_tmp);
    battery(uri, NULL, 3 << 20);
    /* nothing but the objects: no temporary files left */
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open(uri, NULL, &st), CM_OK);
    cr_assert(!cm_object_store_is_remote(st));
    cm_object_store_close(st);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test $(find '%s/store' -name '*.part-*' | wc -l) -eq 0", g_tmp);
    cr_assert_eq(system(cmd), 0, "temporary files left behind");
    snprintf(uri, sizeof uri, "file://%s/store2/", g_tmp);
    char want[300];
    snprintf(want, sizeof want, "file://%s/store2", g_tmp);
    battery(want, NULL, 1 << 20);
    cr_assert_eq(cm_object_store_open(uri, NULL, &st), CM_OK);
    cr_assert_str_eq(cm_object_store_uri(st), want, "the trailing '/' is dropped");
    cm_object_store_close(st);
}

Test(storage_local, bad_uris_get_clear_errors) {
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("s4://bucket/x", NULL, &st), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "did you mean 's3://'"), "message: %s", cm_last_error());
    cr_assert_eq(cm_object_store_open("s3:///x", NULL, &st), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "no bucket"), "message: %s", cm_last_error());
    cr_assert_eq(cm_object_store_open("file://relative", NULL, &st), CM_ERR_INVALID_ARG);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    cr_assert_eq(cm_object_store_open("s3://b/p", NULL, &st), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"), "message: %s", cm_last_error());
    unsetenv("GCS_KEY");
    cr_assert_eq(cm_object_store_open("gs://b/p", NULL, &st), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "GCS_KEY / GCS_SECRET"), "message: %s", cm_last_error());
    setenv("AWS_ACCESS_KEY_ID", "k", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "s", 1);
    unsetenv("S3_ENDPOINT_URL");
    unsetenv("OCI_NAMESPACE");
    cr_assert_eq(cm_object_store_open("oci://b/p", NULL, &st), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "OCI_NAMESPACE and OCI_REGION"), "message: %s", cm_last_error());
    setenv("S3_ENDPOINT_URL", "ftp://host", 1);
    cr_assert_eq(cm_object_store_open("s3://b/p", NULL, &st), CM_ERR_INVALID_ARG);
    cr_assert(strstr(cm_last_error(), "S3_ENDPOINT_URL"), "message: %s", cm_last_error());
    unsetenv("S3_ENDPOINT_URL");
    cr_assert_eq(cm_object_store_open("s3://b/p/", NULL, &st), CM_OK, "%s", cm_last_error());
    cr_assert(cm_object_store_is_remote(st));
    cr_assert_str_eq(cm_object_store_uri(st), "s3://b/p");
    cm_object_store_close(st);
    cr_assert(cm_storage_is_remote("gs://x") && cm_storage_is_remote("oci://x/y") && !cm_storage_is_remote("file:///x") &&
              !cm_storage_is_remote("/x/y") && cm_storage_is_uri("file:///x") && !cm_storage_is_uri("a/b:c"));
}

/* ---------------------------------------------------------------------------------------------
 * S3 on loopback
 * ------------------------------------------------------------------------------------------- */

static cmt_s3 g_s3;

static void s3_setup(void) {
    tmp_setup();
    cmt_s3_start(&g_s3, "bkt");
    cmi_s3_list_max_keys = 0;
}

static void s3_teardown(void) {
    cmt_s3_stop(&g_s3);
    tmp_teardown();
}

static cm_object_store_config fast_cfg(void) {
    cm_object_store_config c = cm_object_store_config_default();
    c.multipart_threshold = 5 << 20;
    c.part_size = 5 << 20; /* S3's smallest */
    c.max_concurrency = 3;
    c.retry_backoff_s = 0.05;
    return c;
}

Test(storage_s3, battery_on_s3rver_every_request_signed_right, .init = s3_setup, .fini = s3_teardown, .timeout = 120) {
    cmi_s3_list_max_keys = 2; /* listings span several pages */
    cm_object_store_config c = fast_cfg();
    battery("s3://bkt/run 1/prefix", &c, (12 << 20) + 12345); /* three parts, the last short */
    /* the independent signer in the proxy accepted every request: puts, multipart (init, parts,
     * complete), HEAD, ranged GETs, list pages, deletes */
    cr_assert_eq(cmt_s3_stat(&g_s3, "refused"), 0, "the proxy refused a request's signature");
    char stats[1 << 16];
    cmt_s3_ctl(&g_s3, "stats", stats, sizeof stats);
    cr_assert(strstr(stats, "?uploads"), "no multipart upload was started: %.300s", stats);
    cr_assert(strstr(stats, "partNumber=3"), "not three parts");
    cr_assert(strstr(stats, "continuation-token="), "the listing did not follow a second page");
    cr_assert(!strstr(stats, "partNumber=4"), "more parts than needed");
}

Test(storage_s3, gs_and_oci_schemes_use_their_credentials_and_endpoints, .init = s3_setup, .fini = s3_teardown) {
    /* gs:// signs with GCS_KEY / GCS_SECRET; the endpoint is storage.googleapis.com unless given */
    setenv("GCS_KEY", CMT_S3_ACCESS, 1);
    setenv("GCS_SECRET", CMT_S3_SECRET, 1);
    setenv("AWS_ACCESS_KEY_ID", "not-used", 1);
    cm_object_store_config c = fast_cfg();
    c.endpoint_url = g_s3.endpoint;
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("gs://bkt/g", &c, &st), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_object_store_put(st, "x", "gcs", 3), CM_OK, "%s", cm_last_error());
    cm_object_store_close(st);
    /* oci:// takes AWS_* keys (OCI customer secret keys) and S3_ENDPOINT_URL */
    setenv("AWS_ACCESS_KEY_ID", CMT_S3_ACCESS, 1);
    cr_assert_eq(cm_object_store_open("oci://bkt/g", NULL, &st), CM_OK, "%s", cm_last_error());
    uint64_t sz;
    cr_assert_eq(cm_object_store_get_size(st, "x", &sz), CM_OK, "%s", cm_last_error());
    cr_assert_eq(sz, 3);
    cm_object_store_close(st);
    cr_assert_eq(cmt_s3_stat(&g_s3, "refused"), 0);
}

Test(storage_s3, wrong_keys_are_refused_and_nothing_is_written, .init = s3_setup, .fini = s3_teardown) {
    cm_object_store_config c = fast_cfg();
    c.secret_access_key = "S3RVEX"; /* one letter off */
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("s3://bkt/p", &c, &st), CM_OK);
    cr_assert_eq(cm_object_store_put(st, "secret.txt", "x", 1), CM_ERR_IO);
    const char *m = cm_last_error();
    cr_assert(strstr(m, "s3://bkt/p/secret.txt") && strstr(m, "HTTP 403 SignatureDoesNotMatch") &&
                  strstr(m, "AWS_SECRET_ACCESS_KEY"),
              "message: %s", m);
    cr_assert_eq(cm_object_store_get_stats(st).retries, 0, "a permanent error is not retried");
    cm_object_store_close(st);
    c.secret_access_key = NULL;
    c.access_key_id = "NOBODY";
    cr_assert_eq(cm_object_store_open("s3://bkt/p", &c, &st), CM_OK);
    cr_assert_eq(cm_object_store_put(st, "secret.txt", "x", 1), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "InvalidAccessKeyId"), "message: %s", cm_last_error());
    cm_object_store_close(st);
    cr_assert_eq(cmt_s3_stat(&g_s3, "refused"), 2);
    /* nothing reached the server */
    cr_assert_eq(cm_object_store_open("s3://bkt/p", NULL, &st), CM_OK);
    cm_object_list l;
    cr_assert_eq(cm_object_store_list(st, "", &l), CM_OK, "%s", cm_last_error());
    cr_assert_eq(l.n, 0);
    cm_object_list_free(&l);
    cm_object_store_close(st);
    /* a missing bucket */
    cr_assert_eq(cm_object_store_open("s3://no-such-bucket/p", NULL, &st), CM_OK);
    cr_assert_eq(cm_object_store_list(st, "", &l), CM_ERR_NOT_FOUND);
    cr_assert(strstr(cm_last_error(), "bucket 'no-such-bucket' does not exist"), "message: %s", cm_last_error());
    cm_object_store_close(st);
}

Test(storage_s3, injected_500s_and_slow_responses_are_retried, .init = s3_setup, .fini = s3_teardown, .timeout = 120) {
    cm_object_store_config c = fast_cfg();
    c.timeout_s = 1;
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("s3://bkt", &c, &st), CM_OK);
    /* 500 twice on the PUT, then it goes through */
    cmt_s3_ctl(&g_s3, "fail?status=500&count=2&match=PUT", NULL, 0);
    cr_assert_eq(cm_object_store_put(st, "k", "value", 5), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_object_store_get_stats(st).retries, 2);
    /* SlowDown (503) on two of the parts of a multipart upload */
    size_t big = (11 << 20) + 7;
    char *data = malloc(big);
    fill(data, big, 3);
    char src[300], dst[300];
    snprintf(src, sizeof src, "%s/big", g_tmp);
    snprintf(dst, sizeof dst, "%s/big.down", g_tmp);
    cmt_write_file(src, data, big);
    cmt_s3_ctl(&g_s3, "fail?status=503&count=2&match=partNumber", NULL, 0);
    cr_assert_eq(cm_object_store_upload(st, "big", src), CM_OK, "%s", cm_last_error());
    cr_assert_eq(cm_object_store_get_stats(st).retries, 4);
    /* a response slower than timeout_s: the request is abandoned and tried again */
    cmt_s3_ctl(&g_s3, "delay?seconds=2.5&count=1&match=GET%20/bkt/big", NULL, 0);
    cr_assert_eq(cm_object_store_download(st, "big", dst), CM_OK, "%s", cm_last_error());
    assert_file_is(dst, data, big);
    cr_assert_eq(cm_object_store_get_stats(st).retries, 5);
    /* a connection cut twice in the middle of the body: the download resumes where it stopped
     * (ranged GETs), so no byte is fetched twice */
    cm_object_store_stats before = cm_object_store_get_stats(st);
    cmt_s3_ctl(&g_s3, "cut?after=1000000&count=2&match=GET%20/bkt/big", NULL, 0);
    cr_assert_eq(cm_object_store_download(st, "big", dst), CM_OK, "%s", cm_last_error());
    assert_file_is(dst, data, big);
    cm_object_store_stats after = cm_object_store_get_stats(st);
    cr_assert_eq(after.retries - before.retries, 2);
    cr_assert_eq(after.bytes_down - before.bytes_down, (int64_t)big, "fetched %lld bytes for a %zu-byte object",
                 (long long)(after.bytes_down - before.bytes_down), big);
    /* a server that keeps failing: a clear error after max_retries, nothing left at the path */
    cmt_s3_ctl(&g_s3, "fail?status=500&count=100&match=GET", NULL, 0);
    char dst2[300];
    snprintf(dst2, sizeof dst2, "%s/never", g_tmp);
    cr_assert_eq(cm_object_store_download(st, "big", dst2), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "s3://bkt/big") && strstr(cm_last_error(), "HTTP 500 InternalError") &&
                  strstr(cm_last_error(), "gave up after 5 retries"),
              "message: %s", cm_last_error());
    cr_assert_eq(access(dst2, F_OK), -1, "a failed download left a file");
    cmt_s3_ctl(&g_s3, "clear", NULL, 0);
    cr_assert_eq(cmt_s3_stat(&g_s3, "refused"), 0);
    free(data);
    cm_object_store_close(st);
}

typedef struct upload_job {
    cm_object_store *st;
    const char *src;
    cm_status s;
    char msg[1024];
} upload_job;

static void *upload_main(void *arg) {
    upload_job *j = arg;
    j->s = cm_object_store_upload(j->st, "mid", j->src);
    snprintf(j->msg, sizeof j->msg, "%s", j->s ? cm_last_error() : "");
    return NULL;
}

static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

Test(storage_s3, server_stopped_mid_upload_then_back_or_gone, .init = s3_setup, .fini = s3_teardown, .timeout = 120) {
    cm_object_store_config c = fast_cfg();
    c.max_concurrency = 1;
    c.retry_backoff_s = 0.3;
    c.max_retries = 6;
    cm_object_store *st;
    cr_assert_eq(cm_object_store_open("s3://bkt", &c, &st), CM_OK);
    size_t big = (15 << 20) + 1;
    char *data = malloc(big);
    fill(data, big, 11);
    char src[300], dst[300];
    snprintf(src, sizeof src, "%s/big", g_tmp);
    snprintf(dst, sizeof dst, "%s/big.down", g_tmp);
    cmt_write_file(src, data, big);
    /* part 2 waits in the proxy; meanwhile the server dies, and comes back a second later */
    cmt_s3_ctl(&g_s3, "delay?seconds=0.6&count=1&match=partNumber=2", NULL, 0);
    upload_job j = {st, src, CM_OK, ""};
    pthread_t th;
    pthread_create(&th, NULL, upload_main, &j);
    nap(0.3);
    cmt_s3_server_kill(&g_s3);
    nap(1.2);
    cmt_s3_server_restart(&g_s3);
    pthread_join(th, NULL);
    cr_assert_eq(j.s, CM_OK, "%s", j.msg);
    cr_assert_geq(cm_object_store_get_stats(st).retries, 1);
    cr_assert_eq(cm_object_store_download(st, "mid", dst), CM_OK, "%s", cm_last_error());
    assert_file_is(dst, data, big);
    cm_object_store_close(st);
    /* gone for good: a clear failure naming the object; the local file is intact and no
     * partial object is visible */
    c.max_retries = 2;
    c.retry_backoff_s = 0.05;
    cr_assert_eq(cm_object_store_open("s3://bkt", &c, &st), CM_OK);
    cmt_s3_server_kill(&g_s3);
    cr_assert_eq(cm_object_store_upload(st, "gone", src), CM_ERR_IO);
    cr_assert(strstr(cm_last_error(), "s3://bkt/gone") && strstr(cm_last_error(), "gave up after 2 retries"),
              "message: %s", cm_last_error());
    assert_file_is(src, data, big);
    cmt_s3_server_restart(&g_s3);
    uint64_t sz;
    cr_assert_eq(cm_object_store_get_size(st, "gone", &sz), CM_ERR_NOT_FOUND);
    cm_object_store_close(st);
    free(data);
}
