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

/* One version for everything: kvclient.h's (the Makefile reads it there). */
#define KVD_VERSION KVC_VERSION_STRING
#define KVD_MAX_ALLOW 32

enum kvd_hugepages { KVD_HUGE_AUTO, KVD_HUGE_ON, KVD_HUGE_OFF };

/* How KV events write a block hash (docs/EVENTS.md). */
enum kvd_events_hash {
	KVD_EVENTS_HASH_UINT64,		/* vLLM's int form: 0 .. 2^64-1 */
	KVD_EVENTS_HASH_INT64,		/* the same bits as a signed 64-bit int */
	KVD_EVENTS_HASH_BYTES,		/* the 16-byte key, big-endian */
};

/* How KV events encode each event (docs/EVENTS.md). */
enum kvd_events_format {
	KVD_EVENTS_FORMAT_ARRAY,	/* vLLM <= 0.23: ["BlockStored", hashes, ...] */
	KVD_EVENTS_FORMAT_MAP,		/* vLLM >= 0.24: {"type": "BlockStored", ...} */
};

#define KVD_ENDPOINT 256		/* ZMQ endpoint bytes, NUL included */
#define KVD_MAX_TENANTS 32		/* `tenant` lines a config may have */
#define KVD_TENANT_NAME 32		/* name bytes, NUL included (KVSHM_TENANT_NAME) */
#define KVD_TENANT_SALT 256		/* salt bytes (KVPROTO_MAX_SALT) */

/* One `tenant` line: the clients of a salt, by the operator's name. */
struct kvd_tenant_cfg {
	char name[KVD_TENANT_NAME];	/* 1..31 of [A-Za-z0-9._-] */
	uint8_t salt[KVD_TENANT_SALT];
	uint32_t salt_len;		/* 0: the unsalted clients */
	uint32_t share;			/* percent of the pool; 0: tenant-share */
	bool no_insert;			/* its clients read and never publish */
	char where[96];			/* its line ("FILE:LINE"), "--" for a flag */
};

#define KVD_CONFIG_MAX_KEYS 64		/* rows of config.c's options[], at most */

/*
 * Where a setting's value came from, as kvd_config_set was told (`where`
 * "default" or "FILE:LINE"; "--" for a flag; "" if never set), and the
 * value as written
 * ("6K", not 6144), so that a message after the parse names them too
 * (kvd_config_where). Cut to the field; written by kvd_config_set only.
 */
struct kvd_config_src {
	char where[160];
	char text[48];
};
#define KVD_TOPIC 128			/* topic template bytes, NUL included */
#define KVD_MEDIUM 16			/* a medium name's bytes, NUL included */

struct kvd_config {
	char socket[108];
	char pool[8];			/* "host" or "cuda" */
	uint32_t gpu;			/* cuda pool: device ordinal */
	uint64_t pool_size;		/* bytes (resolved from pool_share) */
	uint32_t pool_share;		/* pool-size given as PCT%: 1..100, or 0 */
	uint32_t max_announced;		/* blocks one client may hold announced
					 * in flight (single flight) */
	uint32_t max_share;		/* percent of the pool one process may
					 * pin or hold writing */
	uint32_t tenant_share;		/* ... one tenant (salt), over its processes */
	uint32_t namespace_share;	/* ... one namespace (model), over its clients */
	struct kvd_tenant_cfg tenants[KVD_MAX_TENANTS];
	uint32_t n_tenants;
	uint32_t hello_timeout_ms;	/* a connection's time to say HELLO */
	uint32_t slice_timeout_ms;	/* a page several ranks write: time
					 * for its last slice to be asked for
					 * and published (core/slice.c) */
	uint64_t page_size;
	uint32_t block_tokens;
	uint32_t max_clients;
	uint32_t max_per_process;	/* handles one process may attach */
	uint32_t max_pins;		/* pin slots per client */
	uint32_t low_watermark;		/* percent of pages kept free */
	uint32_t high_watermark;	/* percent eviction frees up to */
	uint32_t socket_mode;
	uint32_t tick_ms;
	enum kvd_hugepages hugepages;
	int log_level;
	bool foreground;
	uid_t allow_uid[KVD_MAX_ALLOW];
	int n_allow_uid;
	gid_t allow_gid[KVD_MAX_ALLOW];
	int n_allow_gid;
	char spill_dir[256];		/* empty: no spill tier */
	uint64_t spill_size;		/* bytes of slots under spill_dir */
	int spill_io;			/* enum kvd_sio_kind: auto, uring, threads */
	int eviction;			/* enum kvd_eviction (policy.h) */
	char metrics_listen[64];		/* as given; empty = off */
	struct sockaddr_storage metrics_addr;	/* parsed */
	/* KV events for cluster routers (events.c); empty: none. */
	char kv_events[KVD_ENDPOINT];		/* PUB endpoint */
	char kv_events_replay[KVD_ENDPOINT];	/* ROUTER endpoint, or empty */
	char kv_events_topic[KVD_TOPIC];	/* template: {host}, {model} */
	uint32_t kv_events_buffer;		/* batches kept for replay */
	uint32_t kv_events_hwm;			/* ZMQ_SNDHWM, batches */
	uint32_t kv_events_stall_ms;		/* full queue tolerated; 0: ever */
	int kv_events_hash;			/* enum kvd_events_hash */
	int kv_events_format;			/* enum kvd_events_format */
	char kv_events_host_medium[KVD_MEDIUM];	/* a host pool's medium */
	bool kv_events_connect;			/* connect the PUB, not bind */
	/* Remote tier (remote.c); remote empty: none. */
	char remote[2048];		/* "memcached:HOST:PORT,..." as given */
	int remote_write;		/* enum kvd_remote_write */
	char remote_secret_file[256];	/* empty: none */
	bool remote_insecure;		/* run without a secret (warned) */
	uint32_t remote_timeout_ms;	/* every remote operation */
	char remote_prefix[64];		/* item keys start with it */
	struct kvd_config_src src[KVD_CONFIG_MAX_KEYS];	/* by options[] row */
};

enum kvd_remote_write {
	KVD_REMOTE_PUBLISH = 0,		/* write a block when it is published */
	KVD_REMOTE_EVICT = 1,		/* only when the pool evicts it */
};

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
