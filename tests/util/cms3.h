/* A real S3-compatible server on loopback for tests: s3rver (npm, installed by
 * scripts/install-deps) behind tests/s3/s3proxy.py, which checks every request's SigV4 signature
 * with its own signer and injects faults on demand. Each test starts its own pair on free ports. */
#ifndef CMS3_H
#define CMS3_H

#include <stdbool.h>
#include <sys/types.h>

/* Where scripts/install-deps puts s3rver; CM_S3RVER in the environment overrides it. */
#define CMT_S3RVER_DEFAULT "/usr/local/lib/composer-test-tools/node_modules/.bin/s3rver"
/* s3rver's built-in account (an unknown access key is refused by s3rver and by the proxy). */
#define CMT_S3_ACCESS "S3RVER"
#define CMT_S3_SECRET "S3RVER"

typedef struct cmt_s3 {
    pid_t server_pid, proxy_pid;
    int server_port; /* s3rver's own port (the tests talk to the proxy) */
    int port;        /* the proxy's port: S3_ENDPOINT_URL */
    char dir[256];   /* a temporary folder: s3rver's data and logs */
    char endpoint[64];
    char bucket[64];
} cmt_s3;

/* Starts s3rver with `bucket` and the proxy, and points the process's environment at them:
 * S3_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION (AWS_SESSION_TOKEN
 * unset). Fails the test (with what to do) when s3rver is not installed. */
void cmt_s3_start(cmt_s3 *s, const char *bucket);
/* Stops both and removes the folder. */
void cmt_s3_stop(cmt_s3 *s);
/* Stops s3rver alone (kill -9: a server gone mid-request) / starts it again on the same port with
 * the same data. */
void cmt_s3_server_kill(cmt_s3 *s);
void cmt_s3_server_restart(cmt_s3 *s);
/* Sends a control command to the proxy ("fail?status=500&count=2&match=PUT") and returns its
 * answer in buf (stats is JSON). */
void cmt_s3_ctl(cmt_s3 *s, const char *cmd, char *buf, size_t cap);
/* A counter from the proxy's stats ("requests", "refused", "faults"). */
long cmt_s3_stat(cmt_s3 *s, const char *name);

#endif
