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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../shm/proto.h"
#include "../shm/segment.h"
#include "config.h"
#include "obs/events.h"
#include "util/log.h"
#include "pool/memcheck.h"
#include "tier/remote_fmt.h"

void kvd_config_defaults(struct kvd_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	if (kvproto_socket_path(cfg->socket, sizeof(cfg->socket)))
		cfg->socket[0] = 0;
	strcpy(cfg->pool, "host");
	cfg->pool_size = 1ull << 30;
	cfg->page_size = 2ull << 20;	/* Llama-3-8B, bf16, 16 tokens */
	cfg->block_tokens = 16;
	cfg->max_clients = 64;
	cfg->max_per_process = 16;
	cfg->max_pins = 8192;
	cfg->max_share = 50;
	cfg->hello_timeout_ms = 5000;
	cfg->low_watermark = 5;
	cfg->high_watermark = 10;
	cfg->socket_mode = 0660;
	cfg->tick_ms = 20;
	cfg->hugepages = KVD_HUGE_AUTO;
	cfg->log_level = KVD_LOG_INFO;
	cfg->spill_size = 16ull << 30;
	strcpy(cfg->kv_events_topic, "kv@{host}@{model}");
	cfg->kv_events_buffer = 10000;
	cfg->kv_events_hwm = 10000;
	cfg->kv_events_stall_ms = 1000;
	cfg->remote_write = KVD_REMOTE_PUBLISH;
	cfg->remote_timeout_ms = 100;
	strcpy(cfg->remote_prefix, "kvc");
	/* Our own user, and root: root can read any process's memory
	 * anyway, and `sudo kvstat` should simply work. */
	cfg->allow_uid[0] = geteuid();
	cfg->allow_uid[1] = 0;
	cfg->n_allow_uid = geteuid() ? 2 : 1;
}

void kvd_config_usage(FILE *f)
{
	fprintf(f,
"usage: kvcached [options]\n"
"\n"
"The host-local KV-cache daemon: owns a pool of KV pages and the shared\n"
"index that every libkvclient process on the host reads.\n"
"\n"
"  --config FILE          read settings from FILE (same keys, \"key = value\")\n"
"  --socket PATH          Unix socket (default: $KVCACHED_SOCKET, else\n"
"                         /run/kvcached/kvcached.sock as root,\n"
"                         $XDG_RUNTIME_DIR/kvcached.sock otherwise)\n"
"  --pool host|cuda       where pages live (default host; cuda: GPU memory\n"
"                         shared over CUDA VMM file descriptors)\n"
"  --gpu N                CUDA device ordinal of a cuda pool (default 0)\n"
"  --pool-size SIZE|PCT%%  pool bytes, suffix K M G T (default 1G), or a share\n"
"                         of the memory available to kvcached (e.g. 40%%:\n"
"                         of MemAvailable and any memory cgroup limit)\n"
"  --page-size SIZE       bytes per page slot, a multiple of 4K (default 2M)\n"
"  --block-tokens N       tokens per cached block (default 16)\n"
"  --max-clients N        attached handles at once (default 64)\n"
"  --max-per-process N    handles one process may attach (default 16)\n"
"  --max-pins N           pin slots per client (default 8192; at most\n"
"                         max-share of the pool)\n"
"  --max-share PCT        pool share one process may use (default 50): pages\n"
"                         pinned or writing, over all its handles\n"
"  --hello-timeout-ms N   time to send HELLO (default 5000), then dropped\n"
"  --low-watermark PCT    evict when free pages fall below PCT%% (default 5)\n"
"  --high-watermark PCT   ...until PCT%% are free (default 10)\n"
"  --allow-users LIST     user names or uids that may attach (default: own\n"
"                         user and root; a list replaces both)\n"
"  --allow-groups LIST    group names or gids that may attach (default none)\n"
"  --socket-mode OCTAL    socket file mode (default 0660)\n"
"  --hugepages auto|on|off  hugetlb pages for the host pool (default auto)\n"
"  --log-level error|warning|info|debug  (default info)\n"
"  --tick-ms N            housekeeping period in ms (default 20)\n"
"  --spill-dir DIR        spill evicted pages to slot files in DIR (NVMe);\n"
"                         found again after a restart (default: no spill)\n"
"  --spill-size SIZE      bytes of spill slots under DIR (default 16G)\n"
"  --spill-io auto|uring|threads  (default auto: io_uring if it works, else\n"
"                         pread/pwrite on worker threads)\n"
"  --metrics-listen IP:PORT  serve Prometheus /metrics over HTTP there\n"
"                         (default off; e.g. 127.0.0.1:9464)\n"
"  --kv-events ENDPOINT   publish KV events for cluster routers (vLLM's\n"
"                         format, docs/EVENTS.md) on a ZMQ PUB socket, e.g.\n"
"                         tcp://*:5557 or ipc:///run/kvcached/events\n"
"                         (default off; libzmq is loaded only then)\n"
"  --kv-events-replay ENDPOINT  ROUTER socket that resends buffered batches\n"
"                         from a requested sequence number (default off)\n"
"  --kv-events-buffer N   batches kept for replay (default 10000)\n"
"  --kv-events-topic T    (default kv@{host}@{model}) topic of a namespace's\n"
"                         batches; {host} and {model} are replaced\n"
"  --kv-events-hash uint64|int64|bytes  (default uint64) block hash form:\n"
"                         as vLLM sends it, signed (Dynamo), the 16-byte key\n"
"  --kv-events-hwm N      (default 10000) batches queued per subscriber;\n"
"                         more are dropped and counted\n"
"  --kv-events-stall-ms N  (default 1000) how long one subscriber's full\n"
"                         queue may drop every batch before it alone loses\n"
"                         them (0: never)\n"
"  --kv-events-mode bind|connect  (default bind) bind the endpoint, or\n"
"                         connect to a subscriber that binds\n"
"  --remote memcached:HOST:PORT[,HOST:PORT...]  a remote tier shared by\n"
"                         hosts on these memcached servers (ketama; start\n"
"                         them with -I above page-size; default: none)\n"
"  --remote-write publish|evict  when blocks go there (default publish)\n"
"                         publish: as published; evict: as evicted\n"
"  --remote-secret-file FILE  cluster secret the blocks are sealed with\n"
"                         (HMAC-SHA256); must not be readable by others\n"
"  --remote-insecure      no secret, with a warning (default false)\n"
"  --remote-timeout-ms N  limit of every remote operation (default 100)\n"
"  --remote-prefix WORD   item keys start with WORD (default kvc)\n"
"  --foreground           run in the foreground (kvcached never forks;\n"
"                         accepted for scripts that pass it)\n"
"  --help, --version\n");
}

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

static int parse_ids(const char *val, bool users, struct kvd_config *cfg,
		     const char *where)
{
	char buf[1024], *save = NULL, *tok;
	int n = 0;

	if (strlen(val) >= sizeof(buf)) {
		fprintf(stderr, "kvcached: %s: allow list too long\n", where);
		return -1;
	}
	strcpy(buf, val);
	for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		uint32_t id;

		if (n == KVD_MAX_ALLOW) {
			fprintf(stderr, "kvcached: %s%sallow list has more than %d entries\n", where,
				*where ? ": " : "", KVD_MAX_ALLOW);
			return -1;
		}
		if (parse_u32(tok, 0, UINT32_MAX - 1, &id, 10)) {
			struct passwd *pw = users ? getpwnam(tok) : NULL;
			struct group *gr = users ? NULL : getgrnam(tok);

			if (!pw && !gr) {
				fprintf(stderr, "kvcached: %s%sallow-%s %s: no such %s\n", where,
					*where ? ": " : "", users ? "users" : "groups", tok,
					users ? "user" : "group");
				return -1;
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

int kvd_config_set(struct kvd_config *cfg, const char *key, const char *val,
		   const char *where)
{
#define BAD(what) do { \
		if (*where) \
			fprintf(stderr, "kvcached: %s: %s %s: %s\n", where, key, val, what); \
		else \
			fprintf(stderr, "kvcached: --%s %s: %s\n", key, val, what); \
		return -1; \
	} while (0)
	uint32_t u;

	if (!val)
		val = "";
	if (!strcmp(key, "socket")) {
		if (!*val || strlen(val) >= sizeof(cfg->socket))
			BAD("empty, or longer than 107 bytes");
		strcpy(cfg->socket, val);
	} else if (!strcmp(key, "pool")) {
		if (strcmp(val, "host") && strcmp(val, "cuda"))
			BAD("must be host or cuda");
		strcpy(cfg->pool, val);
	} else if (!strcmp(key, "gpu")) {
		if (parse_u32(val, 0, 1023, &cfg->gpu, 10))
			BAD("must be a CUDA device ordinal 0..1023");
	} else if (!strcmp(key, "pool-size")) {
		size_t l = strlen(val);

		if (l > 1 && val[l - 1] == '%') {
			char num[16];

			if (l - 1 >= sizeof(num))
				BAD("a share must be 1%..100%");
			memcpy(num, val, l - 1);
			num[l - 1] = 0;
			if (parse_u32(num, 1, 100, &cfg->pool_share, 10))
				BAD("a share must be 1%..100%");
		} else {
			if (kvd_parse_size(val, &cfg->pool_size))
				BAD("not a size (a number with an optional K, M, G or T suffix, or a share such as 40%)");
			cfg->pool_share = 0;
		}
	} else if (!strcmp(key, "max-share")) {
		if (parse_u32(val, 1, 100, &cfg->max_share, 10))
			BAD("must be a percentage 1..100");
	} else if (!strcmp(key, "hello-timeout-ms")) {
		if (parse_u32(val, 1, 600000, &cfg->hello_timeout_ms, 10))
			BAD("must be 1..600000");
	} else if (!strcmp(key, "page-size")) {
		if (kvd_parse_size(val, &cfg->page_size))
			BAD("not a size (a number with an optional K, M, G or T suffix)");
	} else if (!strcmp(key, "block-tokens")) {
		if (parse_u32(val, 1, KVSHM_MAX_BLOCK_TOKENS, &cfg->block_tokens, 10))
			BAD("must be 1..1024");
	} else if (!strcmp(key, "max-clients")) {
		if (parse_u32(val, 1, 4096, &cfg->max_clients, 10))
			BAD("must be 1..4096");
	} else if (!strcmp(key, "max-per-process")) {
		if (parse_u32(val, 1, 4096, &cfg->max_per_process, 10))
			BAD("must be 1..4096");
	} else if (!strcmp(key, "max-pins")) {
		if (parse_u32(val, 1, 1u << 22, &cfg->max_pins, 10))
			BAD("must be 1..4194304");
	} else if (!strcmp(key, "low-watermark")) {
		if (parse_u32(val, 0, 90, &cfg->low_watermark, 10))
			BAD("must be a percentage 0..90");
	} else if (!strcmp(key, "high-watermark")) {
		if (parse_u32(val, 0, 95, &cfg->high_watermark, 10))
			BAD("must be a percentage 0..95");
	} else if (!strcmp(key, "tick-ms")) {
		if (parse_u32(val, 1, 10000, &cfg->tick_ms, 10))
			BAD("must be 1..10000");
	} else if (!strcmp(key, "socket-mode")) {
		if (parse_u32(val, 0, 0777, &u, 8))
			BAD("must be an octal mode such as 0660");
		cfg->socket_mode = u;
	} else if (!strcmp(key, "hugepages")) {
		if (!strcmp(val, "auto"))
			cfg->hugepages = KVD_HUGE_AUTO;
		else if (!strcmp(val, "on"))
			cfg->hugepages = KVD_HUGE_ON;
		else if (!strcmp(val, "off"))
			cfg->hugepages = KVD_HUGE_OFF;
		else
			BAD("must be auto, on or off");
	} else if (!strcmp(key, "log-level")) {
		if (!strcmp(val, "error"))
			cfg->log_level = KVD_LOG_ERR;
		else if (!strcmp(val, "warning"))
			cfg->log_level = KVD_LOG_WARN;
		else if (!strcmp(val, "info"))
			cfg->log_level = KVD_LOG_INFO;
		else if (!strcmp(val, "debug"))
			cfg->log_level = KVD_LOG_DEBUG;
		else
			BAD("must be error, warning, info or debug");
	} else if (!strcmp(key, "foreground")) {
		if (!strcmp(val, "") || !strcmp(val, "true") || !strcmp(val, "yes") ||
		    !strcmp(val, "1"))
			cfg->foreground = true;
		else if (!strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "0"))
			cfg->foreground = false;
		else
			BAD("must be true or false");
	} else if (!strcmp(key, "spill-dir")) {
		if (strlen(val) >= sizeof(cfg->spill_dir))
			BAD("longer than 255 bytes");
		if (*val && *val != '/')
			BAD("must be an absolute path");
		strcpy(cfg->spill_dir, val);
	} else if (!strcmp(key, "spill-size")) {
		uint64_t sz;

		if (kvd_parse_size(val, &sz) || !sz)
			BAD("not a size (a non-zero number with an optional K, M, G or T suffix)");
		cfg->spill_size = sz;
	} else if (!strcmp(key, "spill-io")) {
		if (!strcmp(val, "auto"))
			cfg->spill_io = 0;
		else if (!strcmp(val, "uring"))
			cfg->spill_io = 1;
		else if (!strcmp(val, "threads"))
			cfg->spill_io = 2;
		else
			BAD("must be auto, uring or threads");
	} else if (!strcmp(key, "metrics-listen")) {
		if (!*val) {
			cfg->metrics_listen[0] = 0;	/* off */
		} else {
			if (strlen(val) >= sizeof(cfg->metrics_listen) ||
			    kvd_parse_listen(val, &cfg->metrics_addr))
				BAD("must be IP:PORT, e.g. 127.0.0.1:9464 or [::1]:9464");
			strcpy(cfg->metrics_listen, val);
		}
	} else if (!strcmp(key, "kv-events") || !strcmp(key, "kv-events-replay")) {
		char *dst = key[9] ? cfg->kv_events_replay : cfg->kv_events;

		if (*val && kvd_endpoint_check(val))
			BAD("must be a ZMQ endpoint tcp://HOST:PORT or ipc://PATH (printable, under 256 bytes)");
		strcpy(dst, val);
	} else if (!strcmp(key, "kv-events-topic")) {
		const char *why = NULL;

		if (kvd_events_topic_check(val, &why))
			BAD(why);
		strcpy(cfg->kv_events_topic, val);
	} else if (!strcmp(key, "kv-events-buffer")) {
		if (parse_u32(val, 0, 1000000, &cfg->kv_events_buffer, 10))
			BAD("must be 0..1000000 batches");
	} else if (!strcmp(key, "kv-events-hwm")) {
		if (parse_u32(val, 1, 1000000, &cfg->kv_events_hwm, 10))
			BAD("must be 1..1000000 batches");
	} else if (!strcmp(key, "kv-events-stall-ms")) {
		if (parse_u32(val, 0, 3600000, &cfg->kv_events_stall_ms, 10))
			BAD("must be 0..3600000 ms");
	} else if (!strcmp(key, "kv-events-hash")) {
		if (!strcmp(val, "uint64"))
			cfg->kv_events_hash = KVD_EVENTS_HASH_UINT64;
		else if (!strcmp(val, "int64"))
			cfg->kv_events_hash = KVD_EVENTS_HASH_INT64;
		else if (!strcmp(val, "bytes"))
			cfg->kv_events_hash = KVD_EVENTS_HASH_BYTES;
		else
			BAD("must be uint64, int64 or bytes");
	} else if (!strcmp(key, "kv-events-mode")) {
		if (!strcmp(val, "bind"))
			cfg->kv_events_connect = false;
		else if (!strcmp(val, "connect"))
			cfg->kv_events_connect = true;
		else
			BAD("must be bind or connect");
	} else if (!strcmp(key, "remote")) {
		struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS];
		const char *why = NULL;
		unsigned n;

		if (!*val) {
			cfg->remote[0] = 0;	/* none */
		} else {
			if (strlen(val) >= sizeof(cfg->remote))
				BAD("longer than 2047 bytes");
			if (kvd_remote_parse(val, sv, KVD_REMOTE_MAX_SERVERS, &n, &why))
				BAD(why);
			strcpy(cfg->remote, val);
		}
	} else if (!strcmp(key, "remote-write")) {
		if (!strcmp(val, "publish"))
			cfg->remote_write = KVD_REMOTE_PUBLISH;
		else if (!strcmp(val, "evict"))
			cfg->remote_write = KVD_REMOTE_EVICT;
		else
			BAD("must be publish or evict");
	} else if (!strcmp(key, "remote-secret-file")) {
		if (strlen(val) >= sizeof(cfg->remote_secret_file))
			BAD("longer than 255 bytes");
		if (*val && *val != '/')
			BAD("must be an absolute path");
		strcpy(cfg->remote_secret_file, val);
	} else if (!strcmp(key, "remote-insecure")) {
		if (!strcmp(val, "") || !strcmp(val, "true") || !strcmp(val, "yes") ||
		    !strcmp(val, "1"))
			cfg->remote_insecure = true;
		else if (!strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "0"))
			cfg->remote_insecure = false;
		else
			BAD("must be true or false");
	} else if (!strcmp(key, "remote-timeout-ms")) {
		if (parse_u32(val, 1, 60000, &cfg->remote_timeout_ms, 10))
			BAD("must be 1..60000");
	} else if (!strcmp(key, "remote-prefix")) {
		if (!kvd_rval_prefix_ok(val))
			BAD("must be 1..63 letters, digits, '.', '_' or '-'");
		strcpy(cfg->remote_prefix, val);
	} else if (!strcmp(key, "allow-users")) {
		return parse_ids(val, true, cfg, where);
	} else if (!strcmp(key, "allow-groups")) {
		return parse_ids(val, false, cfg, where);
	} else {
		if (*where)
			fprintf(stderr, "kvcached: %s: unknown setting '%s' (see kvcached --help)\n",
				where, key);
		else
			fprintf(stderr, "kvcached: --%s: unknown option (see kvcached --help)\n", key);
		return -1;
	}
	return 0;
#undef BAD
}

static bool known_key(const char *key)
{
	static const char *const keys[] = {
		"allow-groups", "allow-users", "block-tokens", "foreground", "gpu",
		"hello-timeout-ms", "high-watermark", "hugepages", "kv-events",
		"kv-events-buffer", "kv-events-hash", "kv-events-hwm", "kv-events-mode",
		"kv-events-replay", "kv-events-stall-ms", "kv-events-topic", "log-level",
		"low-watermark", "max-clients", "max-per-process", "max-pins", "max-share",
		"metrics-listen", "page-size", "pool", "pool-size", "remote", "remote-insecure",
		"remote-prefix", "remote-secret-file", "remote-timeout-ms", "remote-write", "socket",
		"socket-mode", "spill-dir", "spill-io", "spill-size", "tick-ms",
	};
	size_t i;

	for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!strcmp(key, keys[i]))
			return true;
	return false;
}

/* Keys that take no value on the command line. */
static bool flag_key(const char *key)
{
	return !strcmp(key, "foreground") || !strcmp(key, "remote-insecure");
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
	uint64_t pages;

	if (!cfg->socket[0]) {
		fprintf(stderr, "kvcached: socket: no path (set --socket or KVCACHED_SOCKET)\n");
		return -1;
	}
	if (!cfg->page_size || cfg->page_size % 4096) {
		fprintf(stderr, "kvcached: page-size %llu: must be a non-zero multiple of 4096\n",
			(unsigned long long)cfg->page_size);
		return -1;
	}
	if (cfg->page_size > (1ull << 30)) {
		fprintf(stderr, "kvcached: page-size %llu: more than 1G (one I/O of the spill tier)\n",
			(unsigned long long)cfg->page_size);
		return -1;
	}
	if (cfg->pool_share) {
		uint64_t avail;
		char what[128] = "";

		if (kvd_mem_available(&avail, what, sizeof(what))) {
			fprintf(stderr, "kvcached: pool-size %u%%: cannot tell the memory available (no /proc/meminfo); give a size\n",
				cfg->pool_share);
			return -1;
		}
		cfg->pool_size = avail / 100 * cfg->pool_share / cfg->page_size * cfg->page_size;
	}
	pages = cfg->pool_size / cfg->page_size;
	if (pages < 2) {
		fprintf(stderr, "kvcached: pool-size %llu: holds fewer than 2 pages of page-size %llu\n",
			(unsigned long long)cfg->pool_size, (unsigned long long)cfg->page_size);
		return -1;
	}
	if (pages > (1u << 30)) {
		fprintf(stderr, "kvcached: pool-size %llu: more than 2^30 pages; raise page-size\n",
			(unsigned long long)cfg->pool_size);
		return -1;
	}
	if (cfg->high_watermark < cfg->low_watermark) {
		fprintf(stderr, "kvcached: high-watermark %u: below low-watermark %u\n",
			cfg->high_watermark, cfg->low_watermark);
		return -1;
	}
	if (cfg->kv_events_replay[0] && !cfg->kv_events[0]) {
		fprintf(stderr, "kvcached: kv-events-replay %s: needs kv-events (the PUB endpoint)\n",
			cfg->kv_events_replay);
		return -1;
	}
	if (cfg->kv_events_replay[0] && !strcmp(cfg->kv_events_replay, cfg->kv_events)) {
		fprintf(stderr, "kvcached: kv-events-replay %s: the same endpoint as kv-events\n",
			cfg->kv_events_replay);
		return -1;
	}
	if (cfg->remote[0] && !cfg->remote_secret_file[0] && !cfg->remote_insecure) {
		fprintf(stderr, "kvcached: remote %s: needs remote-secret-file (blocks are sealed with the cluster secret), or remote-insecure to run without one\n",
			cfg->remote);
		return -1;
	}
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
			   !flag_key(argv[i] + 2) && known_key(argv[i] + 2)) {
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
		if (!known_key(key)) {
			fprintf(stderr, "kvcached: --%s: unknown option (see kvcached --help)\n", key);
			return -1;
		}
		if (eq) {
			val = eq + 1;
		} else if (flag_key(key)) {
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
