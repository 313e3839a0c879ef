// SPDX-License-Identifier: MIT
/*
 * config.c - fuzz target for kvcached's settings: the config file parser
 * (kvd_config_buf, the same line loop as kvd_config_file), the command
 * line (kvd_config_args, --config included) and the value parsers under
 * them (kvd_parse_size, kvd_parse_listen, ids, octal modes, enums, the
 * remote tier's server list kvd_remote_parse and item-key prefix).
 *
 * Input: the whole input is a config file body (NULs and all). The bytes
 * after its first NUL are also a command line, one argument per
 * NUL-separated piece; a --config argument there is pointed at a memfd
 * holding the bytes before that NUL, so the file path runs too (and never
 * a real file the fuzzer names). The body up to its first NUL is also
 * handed to kvd_parse_size and kvd_parse_listen directly.
 *
 * Oracle: no crash, no leak; after a successful parse every field is in
 * the range its key documents, and when kvd_config_check passes its
 * invariants hold (page-size a non-zero multiple of 4096, 2..2^30 pages,
 * high-watermark >= low-watermark, a socket path) and the segment layout
 * main.c computes from them succeeds. A parsed configuration
 * written back out, as a file and as flags, parses to the same settings.
 */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../daemon/config.h"
#include "../../daemon/obs/events.h"
#include "../../daemon/pool/memcheck.h"
#include "../../daemon/util/log.h"
#include "../../fmt/remote_item.h"
#include "../../shm/segment.h"

#include "check.h"
#define MAX_ARGS 64

/*
 * 1: a value that reads "--config..." is written back as a separate
 * argument too. This target found that kvd_config_args then reads it as
 * --config (its first pass does not skip other flags' values; regress/
 * config/args-config-as-value): set to 1 together with that fix.
 */
#ifndef KVFUZZ_ARGS_CONFIG_VALUE
#define KVFUZZ_ARGS_CONFIG_VALUE 1
#endif

static int body_fd = -1;
static char body_path[64];

static void check_fields(const struct kvd_config *c)
{
	int i;

	CHECK(memchr(c->socket, 0, sizeof(c->socket)));
	CHECK(!strcmp(c->pool, "host") || !strcmp(c->pool, "cuda"));
	CHECK(c->block_tokens >= 1 && c->block_tokens <= KVSHM_MAX_BLOCK_TOKENS);
	CHECK(c->max_clients >= 1 && c->max_clients <= 4096);
	CHECK(c->max_per_process >= 1 && c->max_per_process <= 4096);
	CHECK(c->max_pins >= 1 && c->max_pins <= (1u << 22));
	CHECK(c->low_watermark <= 90 && c->high_watermark <= 95);
	CHECK(c->tick_ms >= 1 && c->tick_ms <= 10000);
	CHECK(c->socket_mode <= 0777);
	CHECK(c->hugepages == KVD_HUGE_AUTO || c->hugepages == KVD_HUGE_ON ||
	      c->hugepages == KVD_HUGE_OFF);
	CHECK(c->log_level == KVD_LOG_ERR || c->log_level == KVD_LOG_WARN ||
	      c->log_level == KVD_LOG_INFO || c->log_level == KVD_LOG_DEBUG);
	CHECK(c->n_allow_uid >= 0 && c->n_allow_uid <= KVD_MAX_ALLOW);
	CHECK(c->n_allow_gid >= 0 && c->n_allow_gid <= KVD_MAX_ALLOW);
	for (i = 0; i < c->n_allow_gid; i++)
		CHECK(c->allow_gid[i] != (gid_t)-1);
	CHECK(memchr(c->remote, 0, sizeof(c->remote)));
	if (c->remote[0]) {
		struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS];
		const char *why;
		unsigned n;

		CHECK(!kvd_remote_parse(c->remote, sv, KVD_REMOTE_MAX_SERVERS, &n, &why));
		CHECK(n >= 1 && n <= KVD_REMOTE_MAX_SERVERS);
		for (unsigned k = 0; k < n; k++)
			CHECK(sv[k].host[0] && (sv[k].port || sv[k].host[0] == '/'));
	}
	CHECK(c->remote_write == KVD_REMOTE_PUBLISH || c->remote_write == KVD_REMOTE_EVICT);
	CHECK(memchr(c->remote_secret_file, 0, sizeof(c->remote_secret_file)));
	CHECK(!c->remote_secret_file[0] || c->remote_secret_file[0] == '/');
	CHECK(c->remote_timeout_ms >= 1 && c->remote_timeout_ms <= 60000);
	CHECK(kvd_rval_prefix_ok(c->remote_prefix));
	CHECK(memchr(c->metrics_listen, 0, sizeof(c->metrics_listen)));
	CHECK(memchr(c->kv_events, 0, sizeof(c->kv_events)));
	CHECK(memchr(c->kv_events_replay, 0, sizeof(c->kv_events_replay)));
	CHECK(!c->kv_events[0] || !kvd_endpoint_check(c->kv_events));
	CHECK(!c->kv_events_replay[0] || !kvd_endpoint_check(c->kv_events_replay));
	{
		const char *why = NULL;

		CHECK(!kvd_events_topic_check(c->kv_events_topic, &why));
	}
	CHECK(c->kv_events_buffer <= 1000000);
	CHECK(c->kv_events_hwm >= 1 && c->kv_events_hwm <= 1000000);
	CHECK(c->kv_events_stall_ms <= 3600000);
	CHECK(c->kv_events_hash >= KVD_EVENTS_HASH_UINT64 &&
	      c->kv_events_hash <= KVD_EVENTS_HASH_BYTES);
	CHECK(c->kv_events_format == KVD_EVENTS_FORMAT_ARRAY ||
	      c->kv_events_format == KVD_EVENTS_FORMAT_MAP);
	{
		const char *why = NULL;

		CHECK(!kvd_events_medium_check(c->kv_events_host_medium, &why));
	}
	if (c->metrics_listen[0]) {
		struct sockaddr_storage a;

		CHECK(c->metrics_addr.ss_family == AF_INET || c->metrics_addr.ss_family == AF_INET6);
		CHECK(!kvd_parse_listen(c->metrics_listen, &a));
		CHECK(!memcmp(&a, &c->metrics_addr, sizeof(a)));
	}
}

static void check_checked(const struct kvd_config *c)
{
	struct kvshm_geometry geo = { 0 };
	struct kvshm_header h;
	uint64_t pages;

	CHECK(c->socket[0]);
	CHECK(c->page_size && c->page_size % 4096 == 0);
	pages = c->pool_size / c->page_size;
	CHECK(pages >= 2 && pages <= (1u << 30));
	CHECK(c->high_watermark >= c->low_watermark);
	CHECK(!c->kv_events_replay[0] ||
	      (c->kv_events[0] && strcmp(c->kv_events, c->kv_events_replay)));
	CHECK(!c->remote[0] || c->remote_secret_file[0] || c->remote_insecure);
	/* Accepted settings never fail later, at segment_open's layout. */
	geo.page_bytes = c->page_size;
	geo.n_pages = (uint32_t)pages;
	geo.block_tokens = c->block_tokens;
	geo.n_buckets = kvshm_buckets_for(geo.n_pages);
	geo.max_clients = c->max_clients;
	geo.max_ns = 64;
	geo.ledger_slots = c->max_pins;
	CHECK(!kvshm_layout(&h, &geo));
	CHECK(h.geo.pool_bytes <= c->pool_size);
}

static bool cfg_eq(const struct kvd_config *a, const struct kvd_config *b)
{
	return !strcmp(a->socket, b->socket) && !strcmp(a->pool, b->pool) &&
	       a->pool_size == b->pool_size && a->page_size == b->page_size &&
	       a->block_tokens == b->block_tokens && a->max_clients == b->max_clients &&
	       a->max_per_process == b->max_per_process &&
	       a->max_pins == b->max_pins && a->low_watermark == b->low_watermark &&
	       a->high_watermark == b->high_watermark && a->socket_mode == b->socket_mode &&
	       a->tick_ms == b->tick_ms && a->hugepages == b->hugepages &&
	       a->log_level == b->log_level && a->foreground == b->foreground &&
	       a->n_allow_uid == b->n_allow_uid && a->n_allow_gid == b->n_allow_gid &&
	       !memcmp(a->allow_uid, b->allow_uid, sizeof(uid_t) * (size_t)a->n_allow_uid) &&
	       !memcmp(a->allow_gid, b->allow_gid, sizeof(gid_t) * (size_t)a->n_allow_gid) &&
	       !strcmp(a->metrics_listen, b->metrics_listen) &&
	       !strcmp(a->kv_events, b->kv_events) &&
	       !strcmp(a->kv_events_replay, b->kv_events_replay) &&
	       !strcmp(a->kv_events_topic, b->kv_events_topic) &&
	       a->kv_events_buffer == b->kv_events_buffer && a->kv_events_hwm == b->kv_events_hwm &&
	       a->kv_events_stall_ms == b->kv_events_stall_ms &&
	       a->kv_events_hash == b->kv_events_hash &&
	       a->kv_events_format == b->kv_events_format &&
	       !strcmp(a->kv_events_host_medium, b->kv_events_host_medium) &&
	       a->kv_events_connect == b->kv_events_connect &&
	       !strcmp(a->remote, b->remote) &&
	       a->remote_write == b->remote_write &&
	       !strcmp(a->remote_secret_file, b->remote_secret_file) &&
	       a->remote_insecure == b->remote_insecure &&
	       a->remote_timeout_ms == b->remote_timeout_ms &&
	       !strcmp(a->remote_prefix, b->remote_prefix) &&
	       (!a->metrics_listen[0] ||
		!memcmp(&a->metrics_addr, &b->metrics_addr, sizeof(a->metrics_addr)));
}

/* Settings as (key, value) pairs, values in a form the parsers take back. */
struct kv {
	int n;
	char key[40][24];
	char val[40][2100];
};

static void put(struct kv *kv, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void put(struct kv *kv, const char *key, const char *fmt, ...)
{
	va_list ap;

	CHECK(kv->n < 40);
	snprintf(kv->key[kv->n], sizeof(kv->key[0]), "%s", key);
	va_start(ap, fmt);
	CHECK(vsnprintf(kv->val[kv->n], sizeof(kv->val[0]), fmt, ap) < (int)sizeof(kv->val[0]));
	va_end(ap);
	kv->n++;
}

static void ids(char *out, size_t len, const uint32_t *v, int n)
{
	size_t o = 0;
	int i;

	out[0] = 0;
	for (i = 0; i < n; i++)
		o += (size_t)snprintf(out + o, len - o, "%s%u", i ? "," : "", v[i]);
}

static void render(const struct kvd_config *c, struct kv *kv)
{
	static const char *const huge[] = { "auto", "on", "off" };
	char buf[KVD_MAX_ALLOW * 12];

	kv->n = 0;
	if (c->socket[0])
		put(kv, "socket", "%s", c->socket);
	put(kv, "pool", "%s", c->pool);
	put(kv, "pool-size", "%llu", (unsigned long long)c->pool_size);
	put(kv, "page-size", "%llu", (unsigned long long)c->page_size);
	put(kv, "block-tokens", "%u", c->block_tokens);
	put(kv, "max-clients", "%u", c->max_clients);
	put(kv, "max-per-process", "%u", c->max_per_process);
	put(kv, "max-pins", "%u", c->max_pins);
	put(kv, "low-watermark", "%u", c->low_watermark);
	put(kv, "high-watermark", "%u", c->high_watermark);
	put(kv, "tick-ms", "%u", c->tick_ms);
	put(kv, "socket-mode", "0%o", c->socket_mode);
	put(kv, "hugepages", "%s", huge[c->hugepages]);
	put(kv, "log-level", "%s", c->log_level == KVD_LOG_ERR ? "error" :
				   c->log_level == KVD_LOG_WARN ? "warning" :
				   c->log_level == KVD_LOG_INFO ? "info" : "debug");
	put(kv, "foreground", "%s", c->foreground ? "true" : "false");
	put(kv, "metrics-listen", "%s", c->metrics_listen);
	ids(buf, sizeof(buf), (const uint32_t *)c->allow_uid, c->n_allow_uid);
	put(kv, "allow-users", "%s", buf);
	ids(buf, sizeof(buf), (const uint32_t *)c->allow_gid, c->n_allow_gid);
	put(kv, "allow-groups", "%s", buf);
	put(kv, "kv-events", "%s", c->kv_events);
	put(kv, "kv-events-replay", "%s", c->kv_events_replay);
	put(kv, "kv-events-topic", "%s", c->kv_events_topic);
	put(kv, "kv-events-buffer", "%u", c->kv_events_buffer);
	put(kv, "kv-events-hwm", "%u", c->kv_events_hwm);
	put(kv, "kv-events-stall-ms", "%u", c->kv_events_stall_ms);
	put(kv, "kv-events-hash", "%s", c->kv_events_hash == KVD_EVENTS_HASH_INT64 ? "int64" :
					c->kv_events_hash == KVD_EVENTS_HASH_BYTES ? "bytes" : "uint64");
	put(kv, "kv-events-format", "%s",
	    c->kv_events_format == KVD_EVENTS_FORMAT_ARRAY ? "array" : "map");
	put(kv, "kv-events-host-medium", "%s", c->kv_events_host_medium);
	put(kv, "kv-events-mode", "%s", c->kv_events_connect ? "connect" : "bind");
	put(kv, "remote", "%s", c->remote);
	put(kv, "remote-write", "%s", c->remote_write == KVD_REMOTE_EVICT ? "evict" : "publish");
	put(kv, "remote-secret-file", "%s", c->remote_secret_file);
	put(kv, "remote-insecure", "%s", c->remote_insecure ? "true" : "false");
	put(kv, "remote-timeout-ms", "%u", c->remote_timeout_ms);
	put(kv, "remote-prefix", "%s", c->remote_prefix);
}

/* Write c back out as a file and as flags; both must parse to c. */
static void round_trip(const struct kvd_config *c, bool as_file)
{
	struct kv *kv = malloc(sizeof(*kv));
	struct kvd_config back;
	char *argv[2 + 2 * 40], *flags[40], *text;
	size_t len = 0, cap = 64 * 1024;
	int i, argc = 0, rc;

	CHECK(kv);
	render(c, kv);
	if (as_file) {
		text = malloc(cap);
		CHECK(text);
		for (i = 0; i < kv->n; i++)
			len += (size_t)snprintf(text + len, cap - len, "%s = %s\n", kv->key[i],
						kv->val[i]);
		kvd_config_defaults(&back);
		CHECK(!kvd_config_buf(&back, text, len, "round-trip"));
		CHECK(cfg_eq(c, &back));
		free(text);
	}
	/* As flags: "--key value", or "--key=value" (every other key, and
	 * foreground, which takes no separate value). */
	argv[argc++] = "kvcached";
	for (i = 0; i < kv->n; i++) {
		bool eq = !strcmp(kv->key[i], "foreground") ||
			  !strcmp(kv->key[i], "remote-insecure") || (i & 1) ||
			  (!KVFUZZ_ARGS_CONFIG_VALUE && !strncmp(kv->val[i], "--config", 8));

		flags[i] = malloc(strlen(kv->key[i]) + strlen(kv->val[i]) + 4);
		CHECK(flags[i]);
		if (eq) {
			sprintf(flags[i], "--%s=%s", kv->key[i], kv->val[i]);
			argv[argc++] = flags[i];
		} else {
			sprintf(flags[i], "--%s", kv->key[i]);
			argv[argc++] = flags[i];
			argv[argc++] = kv->val[i];
		}
	}
	argv[argc] = NULL;
	kvd_config_defaults(&back);
	rc = kvd_config_args(&back, argc, argv);
	/* Same settings; or the cross-field check refuses them both ways. */
	if (rc == 0) {
		CHECK(cfg_eq(c, &back));
	} else {
		struct kvd_config again = *c;

		CHECK(rc == -1 && kvd_config_check(&again) == -1);
	}
	for (i = 0; i < kv->n; i++)
		free(flags[i]);
	free(kv);
}

static void direct_parsers(const char *s)
{
	struct sockaddr_storage a;
	uint64_t v;

	if (!kvd_parse_size(s, &v)) {
		char dec[32];
		uint64_t w;

		/* Digits first, then at most a suffix: the value reads back. */
		CHECK(s[0] >= '0' && s[0] <= '9');
		snprintf(dec, sizeof(dec), "%llu", (unsigned long long)v);
		CHECK(!kvd_parse_size(dec, &w) && w == v);
	}
	/* A cgroup limit file's text (memcheck.c): "max" or a number that
	 * reads back, nothing else. */
	if (!kvd_mem_parse_limit(s, &v)) {
		const char *t = s;

		while (*t == ' ' || (*t >= '\t' && *t <= '\r'))
			t++;
		CHECK(!strncmp(t, "max", 3) ? v == UINT64_MAX : (*t >= '0' && *t <= '9'));
	}
	if (!kvd_parse_listen(s, &a)) {
		char host[INET6_ADDRSTRLEN];
		const void *ip;
		uint16_t port;

		CHECK(a.ss_family == AF_INET || a.ss_family == AF_INET6);
		if (a.ss_family == AF_INET) {
			ip = &((struct sockaddr_in *)&a)->sin_addr;
			port = ntohs(((struct sockaddr_in *)&a)->sin_port);
		} else {
			ip = &((struct sockaddr_in6 *)&a)->sin6_addr;
			port = ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
		}
		CHECK(inet_ntop(a.ss_family, ip, host, sizeof(host)));
		(void)port;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t body_len = nul ? (size_t)(nul - data) : size;
	struct kvd_config cfg;
	char *str, *argv[MAX_ARGS + 1];
	int argc = 0, rc, i;

	if (body_fd < 0) {
		const char *lv = getenv("KVFUZZ_LOG_LEVEL");

		kvd_log_level = lv ? atoi(lv) : KVD_LOG_DEBUG;
		body_fd = memfd_create("fuzz-config", MFD_CLOEXEC);
		CHECK(body_fd >= 0);
		snprintf(body_path, sizeof(body_path), "/proc/self/fd/%d", body_fd);
	}

	/* 1. The whole input as a config file. */
	kvd_config_defaults(&cfg);
	rc = kvd_config_buf(&cfg, (const char *)data, size, "fuzz.conf");
	CHECK(rc == 0 || rc == -1);
	if (!rc) {
		check_fields(&cfg);
		round_trip(&cfg, true);
		if (!kvd_config_check(&cfg))
			check_checked(&cfg);
	}

	/* 2. The value parsers on the body as one string. */
	str = malloc(body_len + 1);
	CHECK(str);
	memcpy(str, data, body_len);
	str[body_len] = 0;
	direct_parsers(str);
	free(str);

	/* 3. The rest as a command line; --config reads the body. */
	if (!nul)
		return 0;
	CHECK(!ftruncate(body_fd, 0));
	CHECK(pwrite(body_fd, data, body_len, 0) == (ssize_t)body_len);
	argv[argc++] = strdup("kvcached");
	for (const uint8_t *p = nul + 1; p <= data + size && argc < MAX_ARGS;) {
		const uint8_t *end = memchr(p, 0, (size_t)(data + size - p));
		size_t n = end ? (size_t)(end - p) : (size_t)(data + size - p);
		char *a;

		if (argc >= 2 && !strcmp(argv[argc - 1], "--config")) {
			a = strdup(body_path);
		} else if (n >= 9 && !memcmp(p, "--config=", 9)) {
			a = malloc(9 + strlen(body_path) + 1);
			CHECK(a);
			sprintf(a, "--config=%s", body_path);
		} else {
			a = malloc(n + 1);
			CHECK(a);
			memcpy(a, p, n);
			a[n] = 0;
		}
		CHECK(a);
		argv[argc++] = a;
		if (!end)
			break;
		p = end + 1;
	}
	argv[argc] = NULL;
	kvd_config_defaults(&cfg);
	rc = kvd_config_args(&cfg, argc, argv);
	CHECK(rc == 0 || rc == 1 || rc == -1);
	if (!rc) {
		check_fields(&cfg);
		check_checked(&cfg);
		round_trip(&cfg, false);
	}
	for (i = 0; i < argc; i++)
		free(argv[i]);
	return 0;
}
