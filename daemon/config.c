// SPDX-License-Identifier: MIT
/*
 * config.c - the settings' table, options[]: one row per key, and what
 * comes from the rows: reading a value by its row (kvd_config_set), the
 * defaults, --help, --print-options, reload diffs. The sources (file,
 * flags) are config_file.c's; values a type cannot read, config_value.c's.
 *
 * Every message names the source (flag, or file:line), the key and the
 * value: "pool-size 10X: unknown suffix". Nothing is half-applied: the
 * daemon exits on the first error, before it creates anything.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../shm/proto.h"
#include "../shm/segment.h"
#include "config.h"
#include "config_value.h"
#include "obs/events.h"
#include "policy/policy.h"
#include "util/log.h"
#include "pool/memcheck.h"
#include "../fmt/remote_item.h"



/* ------------------------------------------------------------ the table */

enum kvd_opt_type {
	OPT_U32,	/* lo..hi, decimal */
	OPT_OCTAL,	/* lo..hi, octal */
	OPT_SIZE,	/* kvd_parse_size; lo 1: not zero */
	OPT_BOOL,	/* true/yes/1/empty, false/no/0 */
	OPT_WORD,	/* one of `words`, stored as its value in `vals` */
	OPT_PATH,	/* empty, or an absolute path shorter than the field */
	OPT_ENDPOINT,	/* empty, or a ZMQ endpoint (kvd_endpoint_check) */
	OPT_CUSTOM,	/* set() does it */
};

static const char *const w_hugepages[] = { "auto", "on", "off", NULL };
static const int v_hugepages[] = { KVD_HUGE_AUTO, KVD_HUGE_ON, KVD_HUGE_OFF };
static const char *const w_log[] = { "error", "warning", "info", "debug", NULL };
static const int v_log[] = { KVD_LOG_ERR, KVD_LOG_WARN, KVD_LOG_INFO, KVD_LOG_DEBUG };
static const char *const w_pin_barrier[] = { "auto", "fence", NULL };
static const int v_pin_barrier[] = { KVD_PIN_BARRIER_AUTO, KVD_PIN_BARRIER_FENCE };
static const char *const w_spill_io[] = { "auto", "uring", "threads", NULL };
static const int v_spill_io[] = { 0, 1, 2 };
static const char *const w_hash[] = { "uint64", "int64", "bytes", NULL };
static const int v_hash[] = { KVD_EVENTS_HASH_UINT64, KVD_EVENTS_HASH_INT64,
			      KVD_EVENTS_HASH_BYTES };
static const char *const w_format[] = { "array", "map", NULL };
static const int v_format[] = { KVD_EVENTS_FORMAT_ARRAY, KVD_EVENTS_FORMAT_MAP };
static const char *const w_mode[] = { "bind", "connect", NULL };
static const int v_mode[] = { 0, 1 };
static const char *const w_eviction[] = { "lru", "s3fifo", "clock", NULL };
static const int v_eviction[] = { KVD_EVICTION_LRU, KVD_EVICTION_S3FIFO, KVD_EVICTION_CLOCK };
static const char *const w_remote_write[] = { "publish", "evict", NULL };
static const int v_remote_write[] = { KVD_REMOTE_PUBLISH, KVD_REMOTE_EVICT };

/*
 * Every setting, one row each, in the order --help lists them: the key
 * (the config file's, and the long flag --key), the value --help shows
 * (NULL: a flag that takes none), how the value is read and what a bad
 * one is told, the default (a value the row reads; applied by
 * kvd_config_defaults) or, where it is none or computed, what --help
 * says instead, and the help text. Parsing, the defaults and --help come
 * from here, and --print-options dumps it: tests/python/test_options.py
 * checks both man pages and the example config against that dump in
 * full (every key, default and value form; no stale key).
 */
struct kvd_option {
	const char *key;
	const char *arg;
	enum kvd_opt_type type;
	size_t off, size;		/* the field of struct kvd_config */
	uint32_t lo, hi;		/* U32, OCTAL bounds; SIZE: lo 1, not 0 */
	const char *const *words;	/* WORD */
	const int *vals;
	int (*set)(struct kvd_config *cfg, const char *val, const char *where,
		   const char **why);	/* CUSTOM */
	const char *bad;		/* the message for a bad value */
	const char *def;		/* default value, or NULL */
	const char *shown;		/* --help's default where def is NULL */
	const char *help;
	bool live;			/* a reload (SIGHUP) applies it to a running daemon */
};

#define F(field) offsetof(struct kvd_config, field), sizeof(((struct kvd_config *)0)->field)

static const struct kvd_option options[] = {
	{ "socket", "PATH", OPT_CUSTOM, F(socket), .set = kvd_value_socket,
	  .help = "Unix socket (default: $KVCACHED_SOCKET, else /run/kvcached/kvcached.sock "
		  "as root, $XDG_RUNTIME_DIR/kvcached.sock otherwise); a missing folder is "
		  "created (mode 0755, said in the log) and removed at a clean stop (its "
		  "parent must exist; after a SIGKILL the folder stays and is reused)" },
	{ "pool", "host|cuda", OPT_CUSTOM, F(pool), .set = kvd_value_pool, .def = "host",
	  .help = "where pages live (cuda: GPU memory shared over CUDA VMM file descriptors)" },
	{ "gpu", "N", OPT_U32, F(gpu), 0, 1023, .bad = "must be a CUDA device ordinal 0..1023",
	  .def = "0", .help = "CUDA device ordinal of a cuda pool" },
	{ "pool-size", "SIZE|PCT%", OPT_CUSTOM, F(pool_size), .set = kvd_value_pool_size, .def = "1G",
	  .help = "pool bytes, suffix K M G T, or a share of the memory available to "
		  "kvcached (e.g. 40%: of MemAvailable and any memory cgroup limit)" },
	{ "page-size", "SIZE", OPT_SIZE, F(page_size),
	  .bad = "not a size (a number with an optional K, M, G or T suffix)", .def = "2M",
	  .help = "bytes per page slot, a multiple of 4K" },
	{ "block-tokens", "N", OPT_U32, F(block_tokens), 1, KVSHM_MAX_BLOCK_TOKENS,
	  .bad = "must be 1..1024", .def = "16", .help = "tokens per cached block" },
	{ "max-clients", "N", OPT_U32, F(max_clients), 1, 4096, .bad = "must be 1..4096",
	  .def = "64", .help = "attached handles at once" },
	{ "max-per-process", "N", OPT_U32, F(max_per_process), 1, 4096, .bad = "must be 1..4096",
	  .def = "16", .help = "handles one process may attach" },
	{ "max-pins", "N", OPT_U32, F(max_pins), 1, 1u << 22, .bad = "must be 1..4194304",
	  .def = "8192", .help = "pin slots per client (at most max-share of the pool)" },
	{ "max-announced", "N", OPT_U32, F(max_announced), 0, 1u << 22,
	  .bad = "must be 0..4194304", .def = "1024",
	  .help = "blocks one client may have announced in flight and not yet published "
		  "(single flight; pages past it are granted unannounced; 0: none)" },
	{ "max-share", "PCT", OPT_U32, F(max_share), 1, 100,
	  .bad = "must be a percentage 1..100 (50 or 50%)", .def = "50",
	  .help = "pool share one process may use: pages pinned or writing, over all its "
		  "handles", .live = true },
	{ "tenant-share", "PCT", OPT_U32, F(tenant_share), 1, 100,
	  .bad = "must be a percentage 1..100 (50 or 50%)", .def = "100",
	  .help = "pool share one tenant (the clients of one salt) may use: pages pinned or "
		  "writing over all its processes, and its pinned prefixes; a tenant line's "
		  "share= overrides it", .live = true },
	{ "namespace-share", "PCT", OPT_U32, F(namespace_share), 1, 100,
	  .bad = "must be a percentage 1..100 (50 or 50%)", .def = "100",
	  .help = "pool share one namespace (model) may use: pages pinned or writing over "
		  "all its clients", .live = true },
	{ "tenant", "NAME [salt=S|salt-hex=H] [share=PCT] [no-insert]", OPT_CUSTOM, F(tenants),
	  .set = kvd_value_tenant, .shown = "none",
	  .help = "names the clients of one salt (no salt: the unsalted ones) in kvstat and "
		  "the metrics (never the salt itself), with their own share of the pool and, "
		  "with no-insert, lookups and reads only; one line per tenant, repeatable", .live = true },
	{ "hello-timeout-ms", "N", OPT_U32, F(hello_timeout_ms), 1, 600000,
	  .bad = "must be 1..600000", .def = "5000",
	  .help = "time to send HELLO, then the connection is dropped" },
	{ "slice-timeout-ms", "N", OPT_U32, F(slice_timeout_ms), 1, 3600000,
	  .bad = "must be 1..3600000", .def = "10000",
	  .help = "a page the tensor-parallel ranks of an engine write together (each its "
		  "heads): time for every rank's slice to come, then the page is given up" },
	{ "low-watermark", "PCT", OPT_U32, F(low_watermark), 0, 90,
	  .bad = "must be a percentage 0..90 (5 or 5%)", .def = "5",
	  .help = "evict when free pages fall below PCT%", .live = true },
	{ "high-watermark", "PCT", OPT_U32, F(high_watermark), 0, 95,
	  .bad = "must be a percentage 0..95 (10 or 10%)", .def = "10",
	  .help = "...until PCT% are free", .live = true },
	{ "eviction", "lru|s3fifo|clock", OPT_WORD, F(eviction), .words = w_eviction,
	  .vals = v_eviction, .bad = "must be lru, s3fifo or clock", .def = "s3fifo",
	  .help = "which blocks go first, in the pool and the spill tier: s3fifo, "
		  "S3-FIFO (blocks used once go first: scan-resistant), leaves first (a "
		  "block whose children are cached waits for them; children whose parent "
		  "left go first); lru, least recently used leaves first; clock, CLOCK, "
		  "prefix-unaware", .live = true },
	{ "allow-users", "LIST", OPT_CUSTOM, F(allow_uid), .set = kvd_value_users,
	  .help = "user names or uids that may attach (default: own user and root; a list "
		  "replaces both)", .live = true },
	{ "allow-groups", "LIST", OPT_CUSTOM, F(allow_gid), .set = kvd_value_groups, .shown = "none",
	  .help = "group names or gids that may attach", .live = true },
	{ "socket-mode", "OCTAL", OPT_OCTAL, F(socket_mode), 0, 0777,
	  .bad = "must be an octal mode such as 0660", .def = "0660",
	  .help = "socket file mode" },
	{ "hugepages", "auto|on|off", OPT_WORD, F(hugepages), .words = w_hugepages,
	  .vals = v_hugepages, .bad = "must be auto, on or off", .def = "auto",
	  .help = "2 MiB pages for the host pool and the segment: auto (hugetlb if reserved, "
		  "else shmem THP, else 4 KiB), on (hugetlb or fail), off (4 KiB)" },
	{ "pin-barrier", "auto|fence", OPT_WORD, F(pin_barrier), .words = w_pin_barrier,
	  .vals = v_pin_barrier, .bad = "must be auto or fence", .def = "auto",
	  .help = "how lookups' pins are ordered against eviction: auto (membarrier(2) "
		  "before each eviction scan, so a lookup pins with no fence; a fence where "
		  "the kernel lacks it), fence (a fence in every lookup, no interrupt to "
		  "clients' CPUs)" },
	{ "log-level", "error|warning|info|debug", OPT_WORD, F(log_level), .words = w_log,
	  .vals = v_log, .bad = "must be error, warning, info or debug", .def = "info",
	  .help = "what the log shows", .live = true },
	{ "tick-ms", "N", OPT_U32, F(tick_ms), 1, 10000, .bad = "must be 1..10000", .def = "20",
	  .help = "housekeeping period in ms" },
	{ "spill-dir", "DIR", OPT_PATH, F(spill_dir), .bad = "longer than 255 bytes",
	  .shown = "no spill",
	  .help = "spill evicted pages to slot files in DIR (NVMe); found again after a "
		  "restart" },
	{ "spill-size", "SIZE", OPT_SIZE, F(spill_size), 1,
	  .bad = "not a size (a non-zero number with an optional K, M, G or T suffix)",
	  .def = "16G", .help = "bytes of spill slots under DIR" },
	{ "spill-io", "auto|uring|threads", OPT_WORD, F(spill_io), .words = w_spill_io,
	  .vals = v_spill_io, .bad = "must be auto, uring or threads", .def = "auto",
	  .help = "auto: io_uring if it works, else pread/pwrite on worker threads" },
	{ "metrics-listen", "IP:PORT", OPT_CUSTOM, F(metrics_listen), .set = kvd_value_metrics_listen,
	  .shown = "off", .help = "serve Prometheus /metrics over HTTP there (e.g. "
				  "127.0.0.1:9464)" },
	{ "kv-events", "ENDPOINT", OPT_ENDPOINT, F(kv_events),
	  .bad = "must be a ZMQ endpoint tcp://HOST:PORT or ipc://PATH (printable, under 256 bytes)",
	  .shown = "off", .help = "publish KV events for cluster routers (vLLM's format, "
				  "docs/EVENTS.md) on a ZMQ PUB socket, e.g. tcp://*:5557 or "
				  "ipc:///run/kvcached/events (libzmq is loaded only then)" },
	{ "kv-events-replay", "ENDPOINT", OPT_ENDPOINT, F(kv_events_replay),
	  .bad = "must be a ZMQ endpoint tcp://HOST:PORT or ipc://PATH (printable, under 256 bytes)",
	  .shown = "off",
	  .help = "ROUTER socket that resends buffered batches from a requested sequence "
		  "number" },
	{ "kv-events-buffer", "N", OPT_U32, F(kv_events_buffer), 0, 1000000,
	  .bad = "must be 0..1000000 batches", .def = "10000",
	  .help = "batches kept for replay" },
	{ "kv-events-topic", "T", OPT_CUSTOM, F(kv_events_topic), .set = kvd_value_topic,
	  .def = "kv@{host}@{model}",
	  .help = "topic of a namespace's batches; {host} and {model} are replaced" },
	{ "kv-events-hash", "uint64|int64|bytes", OPT_WORD, F(kv_events_hash), .words = w_hash,
	  .vals = v_hash, .bad = "must be uint64, int64 or bytes", .def = "uint64",
	  .help = "block hash form: as vLLM sends it, signed (Dynamo), the 16-byte key" },
	{ "kv-events-format", "array|map", OPT_WORD, F(kv_events_format), .words = w_format,
	  .vals = v_format, .bad = "must be array or map", .def = "map",
	  .help = "each event a tagged array (vLLM up to 0.23) or a map with a \"type\" "
		  "key (vLLM 0.24 on)" },
	{ "kv-events-host-medium", "NAME", OPT_CUSTOM, F(kv_events_host_medium),
	  .set = kvd_value_host_medium, .def = "CPU",
	  .help = "the medium a host pool's blocks are announced in (CPU_PINNED: SGLang's "
		  "router; GPU: routers that credit only the device tier)" },
	{ "kv-events-hwm", "N", OPT_U32, F(kv_events_hwm), 1, 1000000,
	  .bad = "must be 1..1000000 batches", .def = "10000",
	  .help = "batches queued per subscriber; more are dropped and counted" },
	{ "kv-events-stall-ms", "N", OPT_U32, F(kv_events_stall_ms), 0, 3600000,
	  .bad = "must be 0..3600000 ms", .def = "1000",
	  .help = "how long one subscriber's full queue may drop every batch before it "
		  "alone loses them (0: never)" },
	{ "kv-events-mode", "bind|connect", OPT_WORD, F(kv_events_connect), .words = w_mode,
	  .vals = v_mode, .bad = "must be bind or connect", .def = "bind",
	  .help = "bind the endpoint, or connect to a subscriber that binds" },
	{ "remote", "memcached:HOST:PORT[,HOST:PORT...]", OPT_CUSTOM, F(remote),
	  .set = kvd_value_remote, .shown = "none",
	  .help = "a remote tier shared by hosts on these memcached servers (ketama; start "
		  "them with -I above page-size)", .live = true },
	{ "remote-write", "publish|evict", OPT_WORD, F(remote_write), .words = w_remote_write,
	  .vals = v_remote_write, .bad = "must be publish or evict", .def = "publish",
	  .help = "when blocks go there: as published, or as evicted", .live = true },
	{ "remote-secret-file", "FILE", OPT_PATH, F(remote_secret_file),
	  .bad = "longer than 255 bytes", .shown = "none",
	  .help = "cluster secret the blocks are sealed with (Poly1305, a per-item key "
		  "derived by XChaCha20); must not be readable by others", .live = true },
	{ "remote-insecure", NULL, OPT_BOOL, F(remote_insecure), .bad = "must be true or false",
	  .def = "false", .help = "no secret, with a warning", .live = true },
	{ "remote-timeout-ms", "N", OPT_U32, F(remote_timeout_ms), 1, 60000,
	  .bad = "must be 1..60000", .def = "100", .help = "limit of every remote operation",
	  .live = true },
	{ "remote-prefix", "WORD", OPT_CUSTOM, F(remote_prefix), .set = kvd_value_remote_prefix,
	  .def = "kvc", .help = "item keys start with WORD", .live = true },
	{ "foreground", NULL, OPT_BOOL, F(foreground), .bad = "must be true or false",
	  .help = "run in the foreground (kvcached never forks; accepted for scripts that "
		  "pass it)" },
};

#undef F

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))
_Static_assert(N_OPTIONS <= KVD_CONFIG_MAX_KEYS, "struct kvd_config's src[] is too short");

static const struct kvd_option *option(const char *key)
{
	size_t i;

	for (i = 0; i < sizeof(options) / sizeof(options[0]); i++)
		if (!strcmp(key, options[i].key))
			return &options[i];
	return NULL;
}

size_t kvd_config_keys(const char **keys, size_t max)
{
	size_t i, n = sizeof(options) / sizeof(options[0]);

	for (i = 0; i < n && i < max; i++)
		keys[i] = options[i].key;
	return n;
}

/* -1: no such key; 0: a flag that takes no value; 1: one that does. */
int kvd_config_takes(const char *key)
{
	const struct kvd_option *o = option(key);

	return o ? o->arg != NULL : -1;
}

/* ------------------------------------------------------------ reloads */

bool kvd_config_live(const char *key)
{
	const struct kvd_option *o = option(key);

	return o && o->live;
}

/* Do a and b give row o the same value? */
static bool same(const struct kvd_option *o, const struct kvd_config *a,
		 const struct kvd_config *b)
{
	const char *fa = (const char *)a + o->off, *fb = (const char *)b + o->off;
	uint32_t i;

	if (!strcmp(o->key, "pool-size"))	/* a share resolves anew each time */
		return a->pool_share == b->pool_share &&
		       (a->pool_share || a->pool_size == b->pool_size);
	if (!strcmp(o->key, "allow-users"))
		return a->n_allow_uid == b->n_allow_uid &&
		       !memcmp(a->allow_uid, b->allow_uid, (size_t)a->n_allow_uid * sizeof(uid_t));
	if (!strcmp(o->key, "allow-groups"))
		return a->n_allow_gid == b->n_allow_gid &&
		       !memcmp(a->allow_gid, b->allow_gid, (size_t)a->n_allow_gid * sizeof(gid_t));
	if (!strcmp(o->key, "tenant")) {
		if (a->n_tenants != b->n_tenants)
			return false;
		for (i = 0; i < a->n_tenants; i++) {	/* where it was written aside */
			const struct kvd_tenant_cfg *x = &a->tenants[i], *y = &b->tenants[i];

			if (strcmp(x->name, y->name) || x->salt_len != y->salt_len ||
			    memcmp(x->salt, y->salt, x->salt_len) || x->share != y->share ||
			    x->no_insert != y->no_insert)
				return false;
		}
		return true;
	}
	if (o->type == OPT_PATH || o->type == OPT_ENDPOINT || o->type == OPT_CUSTOM)
		return !strncmp(fa, fb, o->size);	/* the rest are strings */
	if (o->type == OPT_WORD && o->size == sizeof(bool))
		return *(const bool *)(const void *)fa == *(const bool *)(const void *)fb;
	return !memcmp(fa, fb, o->size);
}

void kvd_config_diff(const struct kvd_config *a, const struct kvd_config *b,
		     void (*fn)(void *arg, const char *key, bool live), void *arg)
{
	size_t i;

	for (i = 0; i < sizeof(options) / sizeof(options[0]); i++)
		if (!same(&options[i], a, b))
			fn(arg, options[i].key, options[i].live);
}

void kvd_config_show(const struct kvd_config *cfg, const char *key, char *buf, size_t len)
{
	const struct kvd_option *o = option(key);
	const char *f;
	uint64_t sz;
	uint32_t u;
	int i, v;

	if (!len)
		return;
	buf[0] = 0;
	if (!o)
		return;
	f = (const char *)cfg + o->off;
	switch (o->type) {
	case OPT_U32:
	case OPT_OCTAL:
		memcpy(&u, f, sizeof(u));
		snprintf(buf, len, o->type == OPT_OCTAL ? "0%o" : "%u", u);
		break;
	case OPT_SIZE:
		memcpy(&sz, f, sizeof(sz));
		snprintf(buf, len, "%llu", (unsigned long long)sz);
		break;
	case OPT_BOOL:
		snprintf(buf, len, "%s", *(const bool *)(const void *)f ? "true" : "false");
		break;
	case OPT_WORD:
		if (o->size == sizeof(bool))
			v = *(const bool *)(const void *)f;
		else
			memcpy(&v, f, sizeof(v));
		for (i = 0; o->words[i]; i++)
			if (o->vals[i] == v)
				snprintf(buf, len, "%s", o->words[i]);
		break;
	case OPT_PATH:
	case OPT_ENDPOINT:
		snprintf(buf, len, "%s", *f ? f : "(none)");
		break;
	default:
		if (!strcmp(key, "pool-size") && cfg->pool_share)
			snprintf(buf, len, "%u%%", cfg->pool_share);
		else if (!strcmp(key, "pool-size"))
			snprintf(buf, len, "%llu", (unsigned long long)cfg->pool_size);
		else if (!strcmp(key, "allow-users") || !strcmp(key, "allow-groups"))
			snprintf(buf, len, "%d entries",
				 key[6] == 'u' ? cfg->n_allow_uid : cfg->n_allow_gid);
		else if (!strcmp(key, "tenant"))
			snprintf(buf, len, "%u tenants", cfg->n_tenants);
		else if (!*f)
			snprintf(buf, len, "(none)");
		else
			snprintf(buf, len, "%.*s", (int)strnlen(f, o->size), f);
	}
}

/* Apply val by row o: 0, 1 with *why set, or -1 (message printed). */
static int apply(struct kvd_config *cfg, const struct kvd_option *o, const char *val,
		 const char *where, const char **why)
{
	char *field = (char *)cfg + o->off;
	uint64_t sz;
	uint32_t u;
	bool b;
	int i;

	*why = o->bad;
	switch (o->type) {
	case OPT_U32:
	case OPT_OCTAL:
		/* A percentage reads as 50 or 50%, as pool-size's share does. */
		if (o->arg && !strcmp(o->arg, "PCT") && (i = strlen(val)) > 1 && i < 16 &&
		    val[i - 1] == '%') {
			char num[16];

			memcpy(num, val, i - 1);
			num[i - 1] = 0;
			if (kvd_parse_u32(num, o->lo, o->hi, &u, 10))
				return 1;
		} else if (kvd_parse_u32(val, o->lo, o->hi, &u, o->type == OPT_OCTAL ? 8 : 10)) {
			return 1;
		}
		memcpy(field, &u, sizeof(u));
		return 0;
	case OPT_SIZE:
		if (kvd_parse_size(val, &sz) || (o->lo && !sz))
			return 1;
		memcpy(field, &sz, sizeof(sz));
		return 0;
	case OPT_BOOL:
		if (kvd_parse_bool(val, &b))
			return 1;
		memcpy(field, &b, sizeof(b));
		return 0;
	case OPT_WORD:
		for (i = 0; o->words[i]; i++) {
			if (strcmp(val, o->words[i]))
				continue;
			if (o->size == sizeof(bool))
				*(bool *)(void *)field = o->vals[i] != 0;
			else
				memcpy(field, &o->vals[i], sizeof(int));
			return 0;
		}
		return 1;
	case OPT_PATH:
		if (strlen(val) >= o->size)
			return 1;
		if (*val && *val != '/') {
			*why = "must be an absolute path";
			return 1;
		}
		strcpy(field, val);
		return 0;
	case OPT_ENDPOINT:
		if (*val && kvd_endpoint_check(val))
			return 1;
		strcpy(field, val);
		return 0;
	default:
		*why = NULL;
		return o->set(cfg, val, where, why);
	}
}

int kvd_config_set(struct kvd_config *cfg, const char *key, const char *val,
		   const char *where)
{
	const struct kvd_option *o = option(key);
	const char *why = NULL;
	int rc;

	if (!val)
		val = "";
	if (!o) {
		if (*where)
			fprintf(stderr, "kvcached: %s: unknown setting '%s' (see kvcached --help)\n",
				where, key);
		else
			fprintf(stderr, "kvcached: --%s: unknown option (see kvcached --help)\n", key);
		return -1;
	}
	rc = apply(cfg, o, val, where, &why);
	if (rc > 0) {
		if (*where)
			fprintf(stderr, "kvcached: %s: %s %s: %s\n", where, key, val, why);
		else
			fprintf(stderr, "kvcached: --%s %s: %s\n", key, val, why);
	}
	if (!rc) {	/* for messages after the parse: kvd_config_where */
		struct kvd_config_src *src = &cfg->src[o - options];
		size_t l = strlen(val);

		snprintf(src->where, sizeof(src->where), "%s", *where ? where : "--");
		if (l < sizeof(src->text))
			memcpy(src->text, val, l + 1);
		else	/* cut, and said to be */
			snprintf(src->text, sizeof(src->text), "%.*s...",
				 (int)sizeof(src->text) - 4, val);
	}
	return rc ? -1 : 0;
}

const char *kvd_config_where(const struct kvd_config *cfg, const char *key, char *buf,
			     size_t len)
{
	const struct kvd_option *o = option(key);
	const struct kvd_config_src *src = o ? &cfg->src[o - options] : NULL;

	if (!src || !*src->where || !strcmp(src->where, "default"))
		snprintf(buf, len, "%s %s (the default)", key, src ? src->text : "?");
	else if (!strcmp(src->where, "--"))
		snprintf(buf, len, "--%s %s", key, src->text);
	else
		snprintf(buf, len, "%s: %s %s", src->where, key, src->text);
	return buf;
}

void kvd_config_defaults(struct kvd_config *cfg)
{
	size_t i;

	memset(cfg, 0, sizeof(*cfg));
	for (i = 0; i < sizeof(options) / sizeof(options[0]); i++)
		if (options[i].def && kvd_config_set(cfg, options[i].key, options[i].def, "default"))
			abort();	/* a row whose default it does not read */
	if (kvproto_socket_path(cfg->socket, sizeof(cfg->socket))) {
		cfg->socket[0] = 0;
	} else {
		char path[sizeof(cfg->socket)];

		memcpy(path, cfg->socket, sizeof(path));
		kvd_config_set(cfg, "socket", path, "default");
	}
	/* Our own user, and root: root can read any process's memory
	 * anyway, and `sudo kvstat` should simply work. */
	cfg->allow_uid[0] = geteuid();
	cfg->allow_uid[1] = 0;
	cfg->n_allow_uid = geteuid() ? 2 : 1;
}

/* text, wrapped at 79 columns, every line after the first indented by
 * `indent`; the first starts at column `col`. */
static void wrap(FILE *f, const char *text, int col, int indent)
{
	while (*text) {
		int n = (int)strcspn(text, " ");

		if (col > indent && col + 1 + n > 79) {
			fprintf(f, "\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			fputc(' ', f);
			col++;
		}
		fprintf(f, "%.*s", n, text);
		col += n;
		text += n;
		text += strspn(text, " ");
	}
	fputc('\n', f);
}

void kvd_config_usage(FILE *f)
{
	size_t i;

	fprintf(f,
"usage: kvcached [options]\n"
"\n"
"The host-local KV-cache daemon: owns a pool of KV pages and the shared\n"
"index that every libkvclient process on the host reads. Every option is\n"
"also a key of the config file (\"key = value\"); options win over it.\n"
"\n"
"  --config FILE          read settings from FILE (same keys, \"key = value\")\n");
	for (i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
		const struct kvd_option *o = &options[i];
		const char *def = o->def ? o->def : o->shown;
		char head[96];
		int col;

		col = snprintf(head, sizeof(head), "  --%s%s%s", o->key, o->arg ? " " : "",
			       o->arg ? o->arg : "");
		fputs(head, f);
		if (col < 25) {
			fprintf(f, "%*s", 25 - col, "");
			col = 25;
		} else {
			fputs(" ", f);
			col++;
		}
		/* "(default X)", or the first word, stays on the head's line. */
		if (def) {
			col += fprintf(f, "(default %s)", def);
			wrap(f, o->help, col, 25);
		} else {
			int n = (int)strcspn(o->help, " ");

			col += fprintf(f, "%.*s", n, o->help);
			wrap(f, o->help + n + strspn(o->help + n, " "), col, 25);
		}
	}
	fprintf(f, "  --help, --version, --print-options\n");
}

void kvd_config_print_options(FILE *f)
{
	static const char *const types[] = {
		[OPT_U32] = "u32", [OPT_OCTAL] = "octal", [OPT_SIZE] = "size",
		[OPT_BOOL] = "bool", [OPT_WORD] = "word", [OPT_PATH] = "path",
		[OPT_ENDPOINT] = "endpoint", [OPT_CUSTOM] = "custom",
	};
	size_t i;

	for (i = 0; i < N_OPTIONS; i++) {
		const struct kvd_option *o = &options[i];

		fprintf(f, "%s\t%s\t%s\t%s\t%s\t%s\n", o->key, o->def ? o->def : "",
			o->shown ? o->shown : "", types[o->type], o->arg ? o->arg : "",
			o->live ? "live" : "restart");
	}
}
