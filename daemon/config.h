/* SPDX-License-Identifier: MIT */
/*
 * config.h - kvcached's settings: defaults, the config file and the flags.
 * The file takes the same keys as the long flags ("pool-size = 4G").
 */
#ifndef KVD_CONFIG_H
#define KVD_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "../libclient/kvclient.h"
#include "util/settings.h"

/* One version for everything: kvclient.h's (the Makefile reads it there). */
#define KVD_VERSION KVC_VERSION_STRING

/* Defaults: the config table's (config.c; kvd_config_usage shows them). */
void kvd_config_defaults(struct kvd_config *cfg);

/* The keys of every setting, in --help's order: up to max into keys;
 * returns how many there are. */
size_t kvd_config_keys(const char **keys, size_t max);

/*
 * Apply argv (and the --config file it names, before the other flags, so
 * flags win). Returns 0, 1 when --help or --version was printed (exit 0),
 * or -1 after printing a message naming the bad flag, key or value to
 * stderr (exit non-zero).
 */
int kvd_config_args(struct kvd_config *cfg, int argc, char **argv);

/* Apply one "key = value" file. Returns 0 or -1 (message printed). */
int kvd_config_file(struct kvd_config *cfg, const char *path);

/*
 * The same for a file's contents already in memory (`len` bytes, NULs
 * allowed: read as the file would be); `name` stands for the path in
 * messages. For the fuzzer and for tests. Returns 0 or -1 (message
 * printed).
 */
int kvd_config_buf(struct kvd_config *cfg, const char *buf, size_t len,
		   const char *name);

/* Apply one key/value pair; `where` prefixes any message ("file:3"). */
int kvd_config_set(struct kvd_config *cfg, const char *key, const char *val,
		   const char *where);

/*
 * Where key's value came from and how it was written, for a message about
 * it: "FILE:LINE: key VALUE", "--key VALUE" or "key VALUE (the default)".
 * Into buf; returns buf.
 */
const char *kvd_config_where(const struct kvd_config *cfg, const char *key, char *buf,
			     size_t len);

/* Cross-field checks after everything is applied; resolves a pool-size
 * share into bytes. Returns 0 or -1 (message printed, naming where each
 * setting involved came from: kvd_config_where). */
int kvd_config_check(struct kvd_config *cfg);

/* Parse "127.0.0.1:9464" or "[::1]:9464" (IP literals only): 0 or -EINVAL. */
int kvd_parse_listen(const char *s, struct sockaddr_storage *out);

/* A ZMQ endpoint kvcached takes: tcp://HOST:PORT or ipc://PATH, printable,
 * under KVD_ENDPOINT bytes: 0 or -EINVAL. */
int kvd_endpoint_check(const char *s);

/* Parse "4G", "512MiB", "65536": 0 or -EINVAL. */
int kvd_parse_size(const char *s, uint64_t *out);

void kvd_config_usage(FILE *f);
/*
 * --print-options: one line per row of options[], in its order, fields
 * split by tabs: key, default ("" where none), what --help shows where
 * there is no default (""), type (u32 octal size bool word path endpoint
 * custom), the value form ("" for a flag that takes none), live|restart.
 * tests/python/test_options.py checks the manuals and the example config
 * against it.
 */
void kvd_config_print_options(FILE *f);
/* -1: key is no setting; 0: a flag that takes no value; 1: one that does. */
int kvd_config_takes(const char *key);

/* Does a reload (SIGHUP) apply key to a running daemon? (The table's
 * live column: watermarks, shares and tenants, eviction, log level,
 * allow-users/groups, the remote tier's settings.) */
bool kvd_config_live(const char *key);
/* Every setting whose value differs between a and b, in the table's
 * order: fn(arg, key, live). */
void kvd_config_diff(const struct kvd_config *a, const struct kvd_config *b,
		     void (*fn)(void *arg, const char *key, bool live), void *arg);
/* A setting's value, as text for a message ("" for an unknown key). */
void kvd_config_show(const struct kvd_config *cfg, const char *key, char *buf, size_t len);

#endif
