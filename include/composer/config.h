/*
 * composer/config.h — YAML run configurations: a tree loaded from a file (libyaml), command-line
 * overrides "a.b.c=value", typed getters that remember which keys were read, a final check that
 * names every key nobody read (with the closest valid key), and a YAML dump of the resolved tree.
 *
 * This is what `composer train CONFIG.yaml key=value ...` runs on; a program may use it for its
 * own settings the same way:
 *
 *     cm_config *c;
 *     if (cm_config_load_file("examples/shakespeare-char.yaml", &c) != CM_OK ||
 *         cm_config_override(c, "optimizer.lr=3e-4") != CM_OK) {
 *         fprintf(stderr, "error: %s\n", cm_last_error());    // "x.yaml:3:5: ..." or the override
 *         ...
 *     }
 *     double lr;
 *     cm_time max_dur;
 *     int64_t bs;
 *     cm_status s = CM_OK;
 *     if (!s) s = cm_config_get_double(c, "optimizer.lr", 1e-3, &lr);     // default when absent
 *     if (!s) s = cm_config_get_time(c, "max_duration", "1ep", &max_dur);
 *     if (!s) s = cm_config_get_int(c, "train_loader.batch_size", 32, &bs);
 *     if (!s) s = cm_config_check_unknown(c);   // "x.yaml:7:3: unknown key 'optimizer.lrr'
 *                                               //  (did you mean 'optimizer.lr'?)"
 *     cm_config_write(c, stdout);              // the resolved config, defaults included
 *     cm_config_free(c);
 *
 * Paths are dot-separated keys; a segment that is a number indexes a sequence ("optimizer.betas.1").
 * Keys themselves may not contain dots.
 *
 * Values. Scalars keep their YAML text; a getter interprets it: integers (decimal, with an
 * optional sign; "1e3" is accepted when it is a whole number), reals (strtod, plus YAML's .inf /
 * .nan), booleans (true/false, yes/no, on/off, any case), times (composer/time.h strings, plus a
 * bare 0 meaning "never"/"not set"), strings (any scalar). A null value (`key:`, `key: ~`,
 * `key: null`) reads as absent. A type error names where the value came from, the key, the value
 * and what is expected: "x.yaml:4:15: max_duration: '20xx' is not a time: max_duration '20xx':
 * unknown unit 'xx' (...)".
 *
 * Defaults. A getter called for an absent key returns the default and, unless the default is
 * NULL (strings), stores it in the tree, so cm_config_write shows the configuration that was
 * actually used. A getter marks its key — and every map on its path — as read.
 *
 * Where a value came from is kept for messages: "FILE:LINE:COL" for loaded values (1-based, from
 * libyaml's marks), "override 'a.b=1'" for command-line overrides, "default" for defaults.
 *
 * Not supported (errors naming the line): multiple documents in one file, non-scalar map keys,
 * duplicate keys in one map, keys containing '.', more than 1,000,000 nodes (aliases are
 * expanded, so this bounds "billion laughs" inputs).
 *
 * Threading: a config belongs to one thread at a time. The getters change it (they record reads
 * and store defaults).
 */
#ifndef COMPOSER_CONFIG_H
#define COMPOSER_CONFIG_H

#include <composer/base.h>
#include <composer/time.h>

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cm_config cm_config;

/* What a node is. A null value (`key:`) is CM_CONFIG_NULL. */
typedef enum cm_config_kind {
    CM_CONFIG_ABSENT = -1, /* no node at that path */
    CM_CONFIG_NULL = 0,
    CM_CONFIG_SCALAR = 1,
    CM_CONFIG_MAP = 2,
    CM_CONFIG_SEQ = 3,
} cm_config_kind;

/* ---------------------------------------------------------------------------------------------
 * Loading, overriding, freeing
 * ------------------------------------------------------------------------------------------- */

/* An empty configuration (an empty map) named `name` (copied; used in messages; NULL = "config"). */
cm_status cm_config_new(const char *name, cm_config **out);

/* Parses a YAML file whose top level is a map (an empty file is an empty map). Errors:
 * CM_ERR_IO (cannot read; names the path and the system's reason), CM_ERR_FORMAT (YAML syntax
 * errors with "PATH:LINE:COL: what libyaml says"; a top level that is not a map; the unsupported
 * constructs above), CM_ERR_OOM. */
cm_status cm_config_load_file(const char *path, cm_config **out);

/* The same from memory: text[0, len), `name` standing for the file in messages. */
cm_status cm_config_load_string(const char *text, size_t len, const char *name, cm_config **out);

void cm_config_free(cm_config *c); /* NULL is a no-op */

/* Applies one "a.b.c=value" override: the value is parsed as YAML (so "3e-4", "true", "[0.9,
 * 0.95]", "{clipping_type: norm}" and "'quoted'" work; an empty value is null) and replaces the
 * node at the path, creating maps on the way. Errors: CM_ERR_INVALID_ARG (no '=', an empty key or
 * segment, a path through a scalar or a sequence index out of range — naming the override),
 * CM_ERR_FORMAT (a value that is not valid YAML), CM_ERR_OOM. Unknown keys are not an error here:
 * cm_config_check_unknown reports them after the getters ran. */
cm_status cm_config_override(cm_config *c, const char *assignment);

/* Sets the node at `path` to the YAML value `yaml_value` (as an override's value; origin
 * "set"). Errors as cm_config_override. */
cm_status cm_config_set(cm_config *c, const char *path, const char *yaml_value);

/* Removes the node at `path` (no-op when absent). */
void cm_config_remove(cm_config *c, const char *path);

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

/* The kind of the node at `path` (CM_CONFIG_ABSENT when there is none). Does not mark anything
 * read. "" is the root. */
cm_config_kind cm_config_kind_of(const cm_config *c, const char *path);
bool cm_config_has(const cm_config *c, const char *path); /* present and not null */

/* Children of a map or sequence at `path` (0 for absent, null or scalar nodes); for a map, the
 * key of child i (borrowed; valid until the node changes), NULL otherwise or out of range.
 * Neither marks anything read. */
int cm_config_len(const cm_config *c, const char *path);
const char *cm_config_key_at(const cm_config *c, const char *path, int i);

/* Typed getters (see the overview for values, defaults and errors). Each returns CM_OK or
 * CM_ERR_INVALID_ARG with "<origin>: <path>: <what>"; *out is set only on success.
 * get_string: *out borrowed from the tree (valid until the node changes or the config is freed);
 * def NULL leaves an absent key absent and sets *out = NULL. A map or sequence is an error. */
cm_status cm_config_get_string(cm_config *c, const char *path, const char *def, const char **out);
cm_status cm_config_get_int(cm_config *c, const char *path, int64_t def, int64_t *out);
cm_status cm_config_get_double(cm_config *c, const char *path, double def, double *out);
cm_status cm_config_get_bool(cm_config *c, const char *path, bool def, bool *out);
/* def is a time string ("1ep"), or NULL: an absent key gives count 0 in ba and stays absent. */
cm_status cm_config_get_time(cm_config *c, const char *path, const char *def, cm_time *out);
/* One of `choices` (n of them; case-insensitive): *out is the index. The error lists the
 * choices and suggests the closest. def NULL: absent gives *out = -1. */
cm_status cm_config_get_choice(cm_config *c, const char *path, const char *const *choices, int n, const char *def,
                               int *out);
/* A sequence of reals (a single scalar counts as one element): up to cap values into out,
 * *n the count. More than cap is an error naming both counts. Absent: def[0, n_def) (stored). */
cm_status cm_config_get_doubles(cm_config *c, const char *path, const double *def, int n_def, double *out, int cap,
                                int *n);

/* Marks `path` (and the maps on the way) read without interpreting it: for keys a program
 * accepts and ignores. Also records it as a valid key for suggestions. */
void cm_config_touch(cm_config *c, const char *path);
/* Marks the node at `path` (and the maps on the way) read, but not what is below it: for a map of
 * arguments whose every key is read by a getter (an unknown argument is then still reported),
 * or that may be empty ({}). Also records it as a valid key for suggestions. */
void cm_config_mark_read(cm_config *c, const char *path);

/* Where the node at `path` came from ("x.yaml:3:5", "override 'a=1'", "default"), or "" when
 * absent. Borrowed; valid until the next call on c. */
const char *cm_config_origin(const cm_config *c, const char *path);

/* After the getters ran: CM_OK when every key in the tree was read (or touched), else
 * CM_ERR_INVALID_ARG naming the first unread key with its origin and the closest key that was
 * read or asked for — "x.yaml:7:3: unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)" —
 * and how many more unknown keys there are. A key at the wrong level whose name was asked for
 * elsewhere is pointed there ("unknown key 'lr' (did you mean 'optimizer.lr'?)"). */
cm_status cm_config_check_unknown(const cm_config *c);

/* Suggestion helper: the candidate closest to `word` by edit distance if it is close enough to be
 * a likely typo, else NULL. Thread-safe. */
const char *cm_config_closest(const char *word, const char *const *cands, int n);

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

/* Writes the tree as a YAML document (block style; sequences of scalars in flow style; quoted
 * scalars stay quoted), which cm_config_load_* reads back to the same tree. Errors: CM_ERR_IO,
 * CM_ERR_OOM. */
cm_status cm_config_write(const cm_config *c, FILE *f);
/* The same into a new NUL-terminated string (*out cm_alloc'ed; caller cm_frees). */
cm_status cm_config_to_string(const cm_config *c, char **out, size_t *len);
/* The same into a file, atomically (temporary file + rename). CM_ERR_IO naming the path. */
cm_status cm_config_save(const cm_config *c, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* COMPOSER_CONFIG_H */
