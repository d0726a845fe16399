/* Run folders: runs/<run_name>/, created like mkdir -p and reused when present (autoresume), with
 * Composer-style generated names "<unix time>-<adjective>-<animal>". */
#include <composer/report.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const k_adjectives[] = {
    "agile",   "amber",   "ancient", "bold",    "brave",   "bright",  "calm",    "clever",  "cosmic",  "crimson",
    "curious", "daring",  "dazzling", "eager",  "electric", "elegant", "fancy",  "fearless", "fierce", "gentle",
    "giant",   "golden",  "graceful", "happy",  "hidden",  "humble",  "icy",     "jolly",   "keen",    "kind",
    "lively",  "lucky",   "magic",   "mellow",  "mighty",  "misty",   "nimble",  "noble",   "olive",   "patient",
    "polite",  "proud",   "quick",   "quiet",   "rapid",   "rustic",  "scarlet", "serene",  "shiny",   "silent",
    "silver",  "smooth",  "snowy",   "spicy",   "steady",  "stellar", "sunny",   "swift",   "tidy",    "vivid",
    "wild",    "wise",    "witty",   "zesty",
};

static const char *const k_animals[] = {
    "albatross", "alpaca",   "badger",   "beaver",  "bison",    "bobcat",  "buffalo", "camel",    "caribou", "cheetah",
    "cobra",     "condor",   "cougar",   "coyote",  "crane",    "dingo",   "dolphin", "eagle",    "falcon",  "ferret",
    "finch",     "gazelle",  "gecko",    "gibbon",  "giraffe",  "heron",   "hyena",   "ibex",     "iguana",  "jackal",
    "jaguar",    "koala",    "lemur",    "leopard", "lynx",     "macaw",   "marmot",  "meerkat",  "mink",    "moose",
    "narwhal",   "ocelot",   "octopus",  "orca",    "osprey",   "otter",   "owl",     "panda",    "panther", "pelican",
    "penguin",   "puffin",   "python",   "quail",   "raccoon",  "raven",   "salmon",  "seal",     "sparrow", "tapir",
    "tiger",     "toucan",   "walrus",   "wombat",
};

#define N_ADJ (sizeof k_adjectives / sizeof *k_adjectives)
#define N_ANIMAL (sizeof k_animals / sizeof *k_animals)

char *cm_run_name_generate(int64_t unix_time, uint64_t entropy, char *buf, size_t cap) {
    /* Mix the bits so nearby entropy values (a counter, a pid) still pick different words. */
    uint64_t h = cm_hash64(&entropy, sizeof entropy, 0x636f6d706f736572ull);
    snprintf(buf, cap, "%lld-%s-%s", (long long)unix_time, k_adjectives[h % N_ADJ], k_animals[(h >> 32) % N_ANIMAL]);
    return buf;
}

cm_status cm_run_name_check(const char *name) {
    if (!name || !name[0]) return cm_set_error(CM_ERR_INVALID_ARG, "run name is empty (pass NULL to generate one)");
    size_t n = strlen(name);
    if (n > 255)
        return cm_set_error(CM_ERR_INVALID_ARG, "run name '%.40s...' is %zu bytes long (at most 255: it names a folder)",
                            name, n);
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return cm_set_error(CM_ERR_INVALID_ARG, "run name '%s' is not allowed (it would not name a new folder)", name);
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        if (*c == '/')
            return cm_set_error(CM_ERR_INVALID_ARG,
                                "run name '%s' contains '/' (it names one folder; set the root for nesting)", name);
        if (*c < 0x20 || *c == 0x7f)
            return cm_set_error(CM_ERR_INVALID_ARG, "run name contains control character 0x%02x at byte %zu", *c,
                                (size_t)(c - (const unsigned char *)name));
    }
    return CM_OK;
}

/* mkdir -p on a writable copy of the path; names the component that failed. */
static cm_status make_dirs(char *path) {
    size_t len = strlen(path);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        if (path[i - 1] == '/') continue; /* "a//b" */
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0) {
            int err = errno;
            struct stat sb;
            if (err == EEXIST && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                /* already there */
            } else {
                cm_status st = cm_set_error(CM_ERR_IO, "run folder: cannot create '%s': %s", path,
                                            err == EEXIST ? "a file that is not a folder is in the way" : strerror(err));
                path[i] = saved;
                return st;
            }
        }
        path[i] = saved;
    }
    return CM_OK;
}

static uint64_t fresh_entropy(void) {
    uint64_t e = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &e, sizeof e) != (ssize_t)sizeof e) e = 0;
        close(fd);
    }
    return e ^ cm_clock_ns() ^ ((uint64_t)getpid() << 32);
}

cm_status cm_run_folder_path(const char *dir, const char *file, char **out_path) {
    if (!dir || !file || !out_path)
        return cm_set_error(CM_ERR_INVALID_ARG, "cm_run_folder_path: dir, file and out_path must not be NULL");
    size_t ld = strlen(dir), lf = strlen(file);
    bool slash = ld > 0 && dir[ld - 1] != '/';
    char *p = cm_alloc(ld + lf + 2, 16);
    if (!p) return CM_ERR_OOM;
    memcpy(p, dir, ld);
    if (slash) p[ld++] = '/';
    memcpy(p + ld, file, lf + 1);
    *out_path = p;
    return CM_OK;
}

cm_status cm_run_folder_create(const char *root, const char *run_name, char **out_path) {
    if (!out_path) return cm_set_error(CM_ERR_INVALID_ARG, "cm_run_folder_create: out_path must not be NULL");
    *out_path = NULL;
    if (!root || !root[0]) root = CM_RUN_ROOT_DEFAULT;
    char gen[CM_RUN_NAME_MAX];
    if (!run_name) run_name = cm_run_name_generate((int64_t)time(NULL), fresh_entropy(), gen, sizeof gen);
    cm_status st = cm_run_name_check(run_name);
    if (st != CM_OK) return st;
    char *path;
    st = cm_run_folder_path(root, run_name, &path);
    if (st != CM_OK) return st;
    st = make_dirs(path);
    if (st != CM_OK) {
        cm_free(path);
        return st;
    }
    *out_path = path;
    return CM_OK;
}
