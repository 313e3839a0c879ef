// SPDX-License-Identifier: MIT
/*
 * config.c - parsing kvcached's config file and flags.
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
#include "obs/events.h"
#include "policy/policy.h"
#include "util/log.h"
#include "pool/memcheck.h"
#include "../fmt/remote_item.h"

#define KVD_STR_(x) #x
#define KVD_STR(x) KVD_STR_(x)

int kvd_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	uint64_t mul = 1;
	char *end;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case 0: break;
	case 'K': mul = 1ull << 10; end++; break;
	case 'M': mul = 1ull << 20; end++; break;
	case 'G': mul = 1ull << 30; end++; break;
	case 'T': mul = 1ull << 40; end++; break;
	default: return -EINVAL;
	}
	if (mul > 1 && (!strcasecmp(end, "iB") || !strcasecmp(end, "B")))
		end += strlen(end);
	if (*end || (v && mul > UINT64_MAX / v))
		return -EINVAL;
	*out = v * mul;
	return 0;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out, int base)
{
	unsigned long v;
	char *end;

	if (!s || !*s || *s == '-' || isspace((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, base);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int kvd_endpoint_check(const char *s)
{
	bool tcp = !strncmp(s, "tcp://", 6);
	const char *rest = s + 6, *colon;
	uint32_t port;
	size_t i;

	if ((!tcp && strncmp(s, "ipc://", 6)) || !*rest || strlen(s) >= KVD_ENDPOINT)
		return -EINVAL;
	for (i = 0; s[i]; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
			return -EINVAL;
	if (!tcp)
		return 0;
	/* HOST:PORT, HOST may be * or [v6]. */
	colon = strrchr(rest, ':');
	if (!colon || colon == rest || parse_u32(colon + 1, 0, 65535, &port, 10))
		return -EINVAL;
	return 0;
}

int kvd_parse_listen(const char *s, struct sockaddr_storage *out)
{
	char host[64];
	const char *colon, *h = s;
	size_t hl;
	uint32_t port;

	memset(out, 0, sizeof(*out));
	if (*s == '[') {
		const char *rb = strchr(s, ']');

		if (!rb || rb[1] != ':')
			return -EINVAL;
		h = s + 1;
		hl = (size_t)(rb - h);
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -EINVAL;
		hl = (size_t)(colon - s);
	}
	if (!hl || hl >= sizeof(host) || parse_u32(colon + 1, 0, 65535, &port, 10))
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = 0;
	if (*s == '[') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;

		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		return inet_pton(AF_INET6, host, &a->sin6_addr) == 1 ? 0 : -EINVAL;
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)out;

		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -EINVAL;
	}
}

/* An allow list: 0, or 1 with *why naming the entry at fault. */
static int parse_ids(const char *val, bool users, struct kvd_config *cfg, const char **why)
{
	static char msg[160];	/* *why's text; the parse is single-threaded */
	char buf[1024], *save = NULL, *tok;
	int n = 0;

	if (strlen(val) >= sizeof(buf)) {
		*why = "longer than 1023 bytes";
		return 1;
	}
	strcpy(buf, val);
	for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		uint32_t id;

		if (n == KVD_MAX_ALLOW) {
			*why = "more than " KVD_STR(KVD_MAX_ALLOW) " entries";
			return 1;
		}
		if (parse_u32(tok, 0, UINT32_MAX - 1, &id, 10)) {
			struct passwd *pw = users ? getpwnam(tok) : NULL;
			struct group *gr = users ? NULL : getgrnam(tok);

			if (!pw && !gr) {
				snprintf(msg, sizeof(msg), "no such %s '%.100s'",
					 users ? "user" : "group", tok);
				*why = msg;
				return 1;
			}
			id = users ? pw->pw_uid : gr->gr_gid;
		}
		if (users)
			cfg->allow_uid[n++] = id;
		else
			cfg->allow_gid[n++] = id;
	}
	if (users)
		cfg->n_allow_uid = n;
	else
		cfg->n_allow_gid = n;
	return 0;
}

/* ------------------------------------------------------------ values
 * The parsers of the table's CUSTOM rows: 0, 1 with *why naming the
 * problem, or -1 after printing their own message. */

static int set_socket(struct kvd_config *cfg, const char *val, const char *where,
		      const char **why)
{
	(void)where;
	if (!*val || strlen(val) >= sizeof(cfg->socket)) {
		*why = "empty, or longer than 107 bytes";
		return 1;
	}
	strcpy(cfg->socket, val);
	return 0;
}

static int set_pool(struct kvd_config *cfg, const char *val, const char *where,
		    const char **why)
{
	(void)where;
	if (strcmp(val, "host") && strcmp(val, "cuda")) {
		*why = "must be host or cuda";
		return 1;
	}
	strcpy(cfg->pool, val);
	return 0;
}

static int set_pool_size(struct kvd_config *cfg, const char *val, const char *where,
			 const char **why)
{
	size_t l = strlen(val);

	(void)where;
	if (l > 1 && val[l - 1] == '%') {
		char num[16];

		*why = "a share must be 1%..100%";
		if (l - 1 >= sizeof(num))
			return 1;
		memcpy(num, val, l - 1);
		num[l - 1] = 0;
		if (parse_u32(num, 1, 100, &cfg->pool_share, 10))
			return 1;
	} else {
		if (kvd_parse_size(val, &cfg->pool_size)) {
			*why = "not a size (a number with an optional K, M, G or T suffix, or a share such as 40%)";
			return 1;
		}
		cfg->pool_share = 0;
	}
	return 0;
}

static int set_metrics_listen(struct kvd_config *cfg, const char *val, const char *where,
			      const char **why)
{
	(void)where;
	if (!*val) {
		cfg->metrics_listen[0] = 0;	/* off */
		return 0;
	}
	if (strlen(val) >= sizeof(cfg->metrics_listen) ||
	    kvd_parse_listen(val, &cfg->metrics_addr)) {
		*why = "must be IP:PORT, e.g. 127.0.0.1:9464 or [::1]:9464";
		return 1;
	}
	strcpy(cfg->metrics_listen, val);
	return 0;
}

static int set_topic(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why)
{
	(void)where;
	if (kvd_events_topic_check(val, why))
		return 1;
	strcpy(cfg->kv_events_topic, val);
	return 0;
}

static int set_host_medium(struct kvd_config *cfg, const char *val, const char *where,
			   const char **why)
{
	(void)where;
	if (kvd_events_medium_check(val, why))
		return 1;
	strcpy(cfg->kv_events_host_medium, val);
	return 0;
}

static int set_remote(struct kvd_config *cfg, const char *val, const char *where,
		      const char **why)
{
	struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS];
	unsigned n;

	(void)where;
	if (!*val) {
		cfg->remote[0] = 0;	/* none */
		return 0;
	}
	if (strlen(val) >= sizeof(cfg->remote)) {
		*why = "longer than 2047 bytes";
		return 1;
	}
	if (kvd_remote_parse(val, sv, KVD_REMOTE_MAX_SERVERS, &n, why))
		return 1;
	strcpy(cfg->remote, val);
	return 0;
}

static int set_remote_prefix(struct kvd_config *cfg, const char *val, const char *where,
			     const char **why)
{
	(void)where;
	if (!kvd_rval_prefix_ok(val)) {
		*why = "must be 1..63 letters, digits, '.', '_' or '-'";
		return 1;
	}
	strcpy(cfg->remote_prefix, val);
	return 0;
}

static int set_users(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why)
{
	(void)where;
	return parse_ids(val, true, cfg, why);
}

static int set_groups(struct kvd_config *cfg, const char *val, const char *where,
		      const char **why)
{
	(void)where;
	return parse_ids(val, false, cfg, why);
}

/*
 * tenant = NAME [salt=TEXT | salt-hex=HEX] [share=PCT] [no-insert]: the
 * clients of that salt (none: the unsalted ones) are tenant NAME in kvstat
 * and the metrics, held to PCT% of the pool (else tenant-share), and
 * no-insert ones never publish. A line per tenant; a NAME given again
 * replaces its line.
 */
static int set_tenant(struct kvd_config *cfg, const char *val, const char *where,
		      const char **why)
{
	struct kvd_tenant_cfg t;
	char buf[1024], *save = NULL, *tok;
	uint32_t i;
	size_t n;

	memset(&t, 0, sizeof(t));
	if (strlen(val) >= sizeof(buf)) {
		*why = "longer than 1023 bytes";
		return 1;
	}
	strcpy(buf, val);
	tok = strtok_r(buf, " \t", &save);
	n = tok ? strlen(tok) : 0;
	if (!n || n >= sizeof(t.name) || strchr(tok, '=') ||
	    strspn(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != n) {
		*why = "must start with a name of 1..31 letters, digits, '.', '_' or '-' (then salt=, salt-hex=, share=, no-insert)";
		return 1;
	}
	memcpy(t.name, tok, n);
	while ((tok = strtok_r(NULL, " \t", &save))) {
		if (!strncmp(tok, "salt=", 5)) {
			n = strlen(tok + 5);
			if (!n || n > sizeof(t.salt)) {
				*why = "salt= takes 1..256 bytes";
				return 1;
			}
			memcpy(t.salt, tok + 5, n);
			t.salt_len = (uint32_t)n;
		} else if (!strncmp(tok, "salt-hex=", 9)) {
			const char *h = tok + 9;

			n = strlen(h);
			if (!n || n % 2 || n / 2 > sizeof(t.salt) ||
			    strspn(h, "0123456789abcdefABCDEF") != n) {
				*why = "salt-hex= takes 1..256 bytes as pairs of hex digits";
				return 1;
			}
			for (i = 0; i < n / 2; i++) {
				char two[3] = { h[2 * i], h[2 * i + 1], 0 };

				t.salt[i] = (uint8_t)strtoul(two, NULL, 16);
			}
			t.salt_len = (uint32_t)(n / 2);
		} else if (!strncmp(tok, "share=", 6)) {
			char num[16];

			n = strlen(tok + 6);
			if (n && tok[6 + n - 1] == '%')
				n--;
			if (!n || n >= sizeof(num)) {
				*why = "share= must be a percentage 1..100 (50 or 50%)";
				return 1;
			}
			memcpy(num, tok + 6, n);
			num[n] = 0;
			if (parse_u32(num, 1, 100, &t.share, 10)) {
				*why = "share= must be a percentage 1..100 (50 or 50%)";
				return 1;
			}
		} else if (!strcmp(tok, "no-insert")) {
			t.no_insert = true;
		} else {
			*why = "unknown word (salt=, salt-hex=, share=, no-insert)";
			return 1;
		}
	}
	for (i = 0; i < cfg->n_tenants; i++)
		if (!strcmp(cfg->tenants[i].name, t.name))
			break;
	if (i == KVD_MAX_TENANTS) {
		*why = "more than 32 tenants";
		return 1;
	}
	snprintf(t.where, sizeof(t.where), "%s", *where ? where : "--");
	cfg->tenants[i] = t;
	if (i == cfg->n_tenants)
		cfg->n_tenants++;
	return 0;
}

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
 * from here; tests/unit/config checks that the example config and both
 * man pages list every key.
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
	{ "socket", "PATH", OPT_CUSTOM, F(socket), .set = set_socket,
	  .help = "Unix socket (default: $KVCACHED_SOCKET, else /run/kvcached/kvcached.sock "
		  "as root, $XDG_RUNTIME_DIR/kvcached.sock otherwise); a missing folder is "
		  "created (mode 0755, said in the log) and removed at a clean stop (its "
		  "parent must exist; after a SIGKILL the folder stays and is reused)" },
	{ "pool", "host|cuda", OPT_CUSTOM, F(pool), .set = set_pool, .def = "host",
	  .help = "where pages live (cuda: GPU memory shared over CUDA VMM file descriptors)" },
	{ "gpu", "N", OPT_U32, F(gpu), 0, 1023, .bad = "must be a CUDA device ordinal 0..1023",
	  .def = "0", .help = "CUDA device ordinal of a cuda pool" },
	{ "pool-size", "SIZE|PCT%", OPT_CUSTOM, F(pool_size), .set = set_pool_size, .def = "1G",
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
	  .set = set_tenant, .shown = "none",
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
	{ "allow-users", "LIST", OPT_CUSTOM, F(allow_uid), .set = set_users,
	  .help = "user names or uids that may attach (default: own user and root; a list "
		  "replaces both)", .live = true },
	{ "allow-groups", "LIST", OPT_CUSTOM, F(allow_gid), .set = set_groups, .shown = "none",
	  .help = "group names or gids that may attach", .live = true },
	{ "socket-mode", "OCTAL", OPT_OCTAL, F(socket_mode), 0, 0777,
	  .bad = "must be an octal mode such as 0660", .def = "0660",
	  .help = "socket file mode" },
	{ "hugepages", "auto|on|off", OPT_WORD, F(hugepages), .words = w_hugepages,
	  .vals = v_hugepages, .bad = "must be auto, on or off", .def = "auto",
	  .help = "2 MiB pages for the host pool and the segment: auto (hugetlb if reserved, "
		  "else shmem THP, else 4 KiB), on (hugetlb or fail), off (4 KiB)" },
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
	{ "metrics-listen", "IP:PORT", OPT_CUSTOM, F(metrics_listen), .set = set_metrics_listen,
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
	{ "kv-events-topic", "T", OPT_CUSTOM, F(kv_events_topic), .set = set_topic,
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
	  .set = set_host_medium, .def = "CPU",
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
	  .set = set_remote, .shown = "none",
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
	{ "remote-prefix", "WORD", OPT_CUSTOM, F(remote_prefix), .set = set_remote_prefix,
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

static int parse_bool(const char *val, bool *out)
{
	if (!strcmp(val, "") || !strcmp(val, "true") || !strcmp(val, "yes") || !strcmp(val, "1"))
		*out = true;
	else if (!strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "0"))
		*out = false;
	else
		return -EINVAL;
	return 0;
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
			if (parse_u32(num, o->lo, o->hi, &u, 10))
				return 1;
		} else if (parse_u32(val, o->lo, o->hi, &u, o->type == OPT_OCTAL ? 8 : 10)) {
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
		if (parse_bool(val, &b))
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
	fprintf(f, "  --help, --version\n");
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

/*
 * The line loop over an open stream, shared by the file and the buffer
 * entry points so that the fuzzer runs exactly what the daemon runs
 * (fgets included). `name` is the path in messages.
 */
static int config_stream(struct kvd_config *cfg, FILE *f, const char *name)
{
	char line[4096], where[PATH_MAX + 32];
	int lineno = 0, rc = 0;

	while (fgets(line, sizeof(line), f)) {
		char *k, *v, *eq;

		lineno++;
		snprintf(where, sizeof(where), "%s:%d", name, lineno);
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(stderr, "kvcached: %s: line longer than %zu bytes\n", where,
				sizeof(line) - 1);
			rc = -1;
			break;
		}
		k = trim(line);
		if (!*k || *k == '#')
			continue;
		eq = strchr(k, '=');
		if (!eq) {
			fprintf(stderr, "kvcached: %s: expected 'key = value', got '%s'\n", where, k);
			rc = -1;
			break;
		}
		*eq = 0;
		v = trim(eq + 1);
		k = trim(k);
		if (!strcmp(k, "config")) {
			fprintf(stderr, "kvcached: %s: 'config' cannot be set in a config file\n",
				where);
			rc = -1;
			break;
		}
		if ((rc = kvd_config_set(cfg, k, v, where)))
			break;
	}
	if (!rc && ferror(f)) {
		fprintf(stderr, "kvcached: config %s: read error\n", name);
		rc = -1;
	}
	return rc;
}

int kvd_config_file(struct kvd_config *cfg, const char *path)
{
	FILE *f = fopen(path, "r");
	int rc;

	if (!f) {
		fprintf(stderr, "kvcached: config %s: %s\n", path, strerror(errno));
		return -1;
	}
	rc = config_stream(cfg, f, path);
	fclose(f);
	return rc;
}

int kvd_config_buf(struct kvd_config *cfg, const char *buf, size_t len, const char *name)
{
	/* fmemopen reads like a file: same fgets, same end-of-file rules. */
	FILE *f = fmemopen((void *)buf, len, "r");
	int rc;

	if (!f) {
		fprintf(stderr, "kvcached: config %s: %s\n", name, strerror(errno));
		return -1;
	}
	rc = config_stream(cfg, f, name);
	fclose(f);
	return rc;
}

int kvd_config_check(struct kvd_config *cfg)
{
	char a[256], b[256];
	uint64_t pages;

#define WHERE(key) kvd_config_where(cfg, key, a, sizeof(a))
#define WHERE2(key) kvd_config_where(cfg, key, b, sizeof(b))
	if (!cfg->socket[0]) {
		fprintf(stderr, "kvcached: socket: no path (set --socket or KVCACHED_SOCKET)\n");
		return -1;
	}
	if (!cfg->page_size || cfg->page_size % 4096) {
		fprintf(stderr, "kvcached: %s: must be a non-zero multiple of 4096 (4K)\n",
			WHERE("page-size"));
		return -1;
	}
	if (cfg->page_size > (1ull << 30)) {
		fprintf(stderr, "kvcached: %s: more than 1G (one I/O of the spill tier)\n",
			WHERE("page-size"));
		return -1;
	}
	if (cfg->pool_share) {
		uint64_t avail;
		char what[128] = "";

		if (kvd_mem_available(&avail, what, sizeof(what))) {
			fprintf(stderr, "kvcached: %s: cannot tell the memory available (no /proc/meminfo); give a size\n",
				WHERE("pool-size"));
			return -1;
		}
		cfg->pool_size = avail / 100 * cfg->pool_share / cfg->page_size * cfg->page_size;
	}
	pages = cfg->pool_size / cfg->page_size;
	if (pages < 2) {
		fprintf(stderr, "kvcached: %s: %llu bytes, fewer than 2 pages of %s\n",
			WHERE("pool-size"), (unsigned long long)cfg->pool_size,
			WHERE2("page-size"));
		return -1;
	}
	if (pages > (1u << 30)) {
		fprintf(stderr, "kvcached: %s: more than 2^30 pages of %s; raise page-size\n",
			WHERE("pool-size"), WHERE2("page-size"));
		return -1;
	}
	if (cfg->high_watermark < cfg->low_watermark) {
		fprintf(stderr, "kvcached: %s: below %s\n", WHERE("high-watermark"),
			WHERE2("low-watermark"));
		return -1;
	}
	{
		uint32_t i, j;

		for (i = 0; i < cfg->n_tenants; i++)
			for (j = 0; j < i; j++)
				if (cfg->tenants[i].salt_len == cfg->tenants[j].salt_len &&
				    !memcmp(cfg->tenants[i].salt, cfg->tenants[j].salt,
					    cfg->tenants[i].salt_len)) {
					fprintf(stderr, "kvcached: %s: tenant %s: the same salt as tenant %s (%s; a salt is one tenant)\n",
						cfg->tenants[i].where, cfg->tenants[i].name,
						cfg->tenants[j].name, cfg->tenants[j].where);
					return -1;
				}
	}
	if (cfg->kv_events_replay[0] && !cfg->kv_events[0]) {
		fprintf(stderr, "kvcached: %s: needs kv-events (the PUB endpoint)\n",
			WHERE("kv-events-replay"));
		return -1;
	}
	if (cfg->kv_events_replay[0] && !strcmp(cfg->kv_events_replay, cfg->kv_events)) {
		fprintf(stderr, "kvcached: %s: the same endpoint as %s\n", WHERE("kv-events-replay"),
			WHERE2("kv-events"));
		return -1;
	}
	if (cfg->remote[0] && !cfg->remote_secret_file[0] && !cfg->remote_insecure) {
		fprintf(stderr, "kvcached: %s: needs remote-secret-file (blocks are sealed with the cluster secret), or remote-insecure to run without one\n",
			WHERE("remote"));
		return -1;
	}
#undef WHERE
#undef WHERE2
	return 0;
}

int kvd_config_args(struct kvd_config *cfg, int argc, char **argv)
{
	const char *file = NULL;
	int i;

	/* The file first, so that flags override it wherever they stand. */
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "kvcached: --config: needs a file\n");
				return -1;
			}
			file = argv[++i];
		} else if (!strncmp(argv[i], "--config=", 9)) {
			file = argv[i] + 9;
		} else if (!strncmp(argv[i], "--", 2) && !strchr(argv[i], '=') &&
			   option(argv[i] + 2) && option(argv[i] + 2)->arg) {
			i++;	/* its value, even one that reads "--config" */
		}
	}
	if (file && kvd_config_file(cfg, file))
		return -1;
	for (i = 1; i < argc; i++) {
		char key[64];
		const char *a = argv[i], *val = NULL, *eq;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			kvd_config_usage(stdout);
			return 1;
		}
		if (!strcmp(a, "--version")) {
			printf("kvcached %s (shm layout %u, protocol %u)\n", KVD_VERSION,
			       KVSHM_VERSION, KVPROTO_VERSION);
			return 1;
		}
		if (strncmp(a, "--", 2) || strlen(a) < 3) {
			fprintf(stderr, "kvcached: unexpected argument '%s' (see --help)\n", a);
			return -1;
		}
		a += 2;
		eq = strchr(a, '=');
		if ((eq ? (size_t)(eq - a) : strlen(a)) >= sizeof(key)) {
			fprintf(stderr, "kvcached: --%s: unknown option\n", a);
			return -1;
		}
		snprintf(key, sizeof(key), "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
		if (!strcmp(key, "config")) {
			if (!eq)
				i++;
			continue;
		}
		if (!option(key)) {
			fprintf(stderr, "kvcached: --%s: unknown option (see kvcached --help)\n", key);
			return -1;
		}
		if (eq) {
			val = eq + 1;
		} else if (!option(key)->arg) {
			val = "true";
		} else {
			if (i + 1 >= argc) {
				fprintf(stderr, "kvcached: --%s: needs a value\n", key);
				return -1;
			}
			val = argv[++i];
		}
		if (kvd_config_set(cfg, key, val, ""))
			return -1;
	}
	return kvd_config_check(cfg);
}
