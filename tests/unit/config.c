// SPDX-License-Identifier: MIT
/*
 * config.c - unit tests for daemon/config.c: sizes, settings, the config
 * file, the cross-field checks and the command line.
 *
 * Every key is tried with good and bad values; a bad value leaves -1 and a
 * message (captured from fd 2) that names where it came from (file:line or
 * the flag) and the key. Flags override the file wherever they stand.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../daemon/config.h"
#include "../../daemon/util/log.h"
#include "../../daemon/policy/policy.h"

#define SOCK "/tmp/kvt-unit-config.sock"

/* ------------------------------------------------- capturing fd 1 and 2 */

struct cap {
	int target;
	int saved;
	int fd;
	char path[64];
	char text[8192];
};

static void cap_begin(struct cap *c, int target)
{
	strcpy(c->path, "/tmp/kvt-config-cap.XXXXXX");
	c->target = target;
	fflush(stdout);
	fflush(stderr);
	c->fd = mkstemp(c->path);
	assert_true(c->fd >= 0);
	c->saved = dup(target);
	assert_true(c->saved >= 0);
	assert_true(dup2(c->fd, target) >= 0);
}

/* Restore the fd; c->text holds what was written meanwhile. */
static const char *cap_end(struct cap *c)
{
	ssize_t n;

	fflush(stdout);
	fflush(stderr);
	dup2(c->saved, c->target);
	close(c->saved);
	n = pread(c->fd, c->text, sizeof(c->text) - 1, 0);
	close(c->fd);
	unlink(c->path);
	assert_true(n >= 0);
	c->text[n] = 0;
	return c->text;
}

static void assert_has(const char *text, const char *want)
{
	if (!strstr(text, want))
		fail_msg("expected \"%s\" in: %s", want, text);
}

/* kvd_config_set with stderr captured; returns rc, message in c->text. */
static int set_cap(struct kvd_config *cfg, struct cap *c, const char *key,
		   const char *val, const char *where)
{
	int rc;

	cap_begin(c, 2);
	rc = kvd_config_set(cfg, key, val, where);
	cap_end(c);
	return rc;
}

/* ------------------------------------------------------------ temp files */

static char *write_file(const char *text)
{
	static char path[64];
	int fd;
	size_t n = strlen(text);

	strcpy(path, "/tmp/kvt-config.XXXXXX");
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, n), (ssize_t)n);
	close(fd);
	return path;
}

static char *saved_sock;

static int group_setup(void **state)
{
	const char *s = getenv("KVCACHED_SOCKET");

	(void)state;
	saved_sock = s ? strdup(s) : NULL;
	/* Defaults then do not depend on who runs the tests. */
	return setenv("KVCACHED_SOCKET", SOCK, 1);
}

static int group_teardown(void **state)
{
	(void)state;
	if (saved_sock)
		setenv("KVCACHED_SOCKET", saved_sock, 1);
	else
		unsetenv("KVCACHED_SOCKET");
	free(saved_sock);
	return 0;
}

/* ------------------------------------------------------------ sizes */

static void test_parse_size_good(void **state)
{
	static const struct {
		const char *s;
		uint64_t v;
	} good[] = {
		{ "0", 0 },
		{ "10", 10 },
		{ "65536", 65536 },
		{ "64K", 64ull << 10 },
		{ "64k", 64ull << 10 },
		{ "512M", 512ull << 20 },
		{ "4G", 4ull << 30 },
		{ "4g", 4ull << 30 },
		{ "1T", 1ull << 40 },
		{ "4GiB", 4ull << 30 },
		{ "4gib", 4ull << 30 },
		{ "4GB", 4ull << 30 },
		{ "2MiB", 2ull << 20 },
		{ "0G", 0 },
		{ "18446744073709551615", UINT64_MAX },
		{ "16777215T", 16777215ull << 40 },	/* largest T that fits */
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		uint64_t v = 12345;

		if (kvd_parse_size(good[i].s, &v))
			fail_msg("kvd_parse_size(\"%s\") refused", good[i].s);
		assert_int_equal(v, good[i].v);
	}
}

static void test_parse_size_bad(void **state)
{
	static const char *const bad[] = {
		"10X", "", "G", "-1", "99999999999T", "16777216T", "17179869184G",
		"18446744073709551616", "99999999999999999999999", " 4G", "4G ",
		"4 G", "1.5G", "0x10", "4GiBB", "4iB", "4B", "4Gi", "+4G", "4KG",
		"4E", "K",
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t v = 12345;

		if (kvd_parse_size(bad[i], &v) != -EINVAL)
			fail_msg("kvd_parse_size(\"%s\") accepted", bad[i]);
		assert_int_equal(v, 12345);	/* untouched */
	}
	assert_int_equal(kvd_parse_size(NULL, &(uint64_t){ 0 }), -EINVAL);
}

/* ------------------------------------------------------------ settings */

static void test_defaults(void **state)
{
	struct kvd_config cfg;

	(void)state;
	kvd_config_defaults(&cfg);
	assert_string_equal(cfg.socket, SOCK);
	assert_string_equal(cfg.pool, "host");
	assert_int_equal(cfg.pool_size, 1ull << 30);
	assert_int_equal(cfg.page_size, 2ull << 20);
	assert_int_equal(cfg.block_tokens, 16);
	assert_int_equal(cfg.low_watermark, 5);
	assert_int_equal(cfg.high_watermark, 10);
	assert_int_equal(cfg.eviction, KVD_EVICTION_S3FIFO);
	assert_int_equal(cfg.socket_mode, 0660);
	assert_int_equal(cfg.n_allow_uid, 1);
	assert_int_equal(cfg.allow_uid[0], geteuid());
	assert_int_equal(cfg.n_allow_gid, 0);
	assert_false(cfg.foreground);
	assert_string_equal(cfg.kv_events, "");	/* no events, no libzmq */
	assert_string_equal(cfg.kv_events_topic, "kv@{host}@{model}");
	assert_int_equal(cfg.kv_events_buffer, 10000);
	assert_int_equal(cfg.kv_events_hash, KVD_EVENTS_HASH_UINT64);
	assert_int_equal(cfg.kv_events_format, KVD_EVENTS_FORMAT_MAP);	/* vLLM 0.24 on */
	assert_string_equal(cfg.kv_events_host_medium, "CPU");
	assert_false(cfg.kv_events_connect);
	/* The defaults pass the checks. */
	assert_int_equal(kvd_config_check(&cfg), 0);
}

static void test_set_good(void **state)
{
	struct kvd_config cfg;
	struct cap c;

	(void)state;
	kvd_config_defaults(&cfg);
#define GOOD(k, v) do { if (set_cap(&cfg, &c, k, v, "")) \
		fail_msg("%s = %s refused: %s", k, v, c.text); } while (0)
	GOOD("socket", "/tmp/other.sock");
	assert_string_equal(cfg.socket, "/tmp/other.sock");
	GOOD("pool", "cuda");
	assert_string_equal(cfg.pool, "cuda");
	GOOD("pool", "host");
	assert_string_equal(cfg.pool, "host");
	GOOD("gpu", "3");
	assert_int_equal(cfg.gpu, 3);
	GOOD("gpu", "0");
	assert_int_equal(cfg.gpu, 0);
	GOOD("pool-size", "4G");
	assert_int_equal(cfg.pool_size, 4ull << 30);
	/* Every percentage takes the forms pool-size's share takes. */
	GOOD("max-share", "100%");
	assert_int_equal(cfg.max_share, 100);
	GOOD("max-share", "40");
	assert_int_equal(cfg.max_share, 40);
	GOOD("low-watermark", "7%");
	assert_int_equal(cfg.low_watermark, 7);
	GOOD("high-watermark", "12%");
	assert_int_equal(cfg.high_watermark, 12);
	GOOD("spill-dir", "/var/lib/kvcached/spill");
	assert_string_equal(cfg.spill_dir, "/var/lib/kvcached/spill");
	GOOD("spill-dir", "");		/* off again */
	assert_string_equal(cfg.spill_dir, "");
	GOOD("spill-size", "64G");
	assert_int_equal(cfg.spill_size, 64ull << 30);
	GOOD("spill-io", "threads");
	assert_int_equal(cfg.spill_io, 2);
	GOOD("spill-io", "uring");
	assert_int_equal(cfg.spill_io, 1);
	GOOD("spill-io", "auto");
	assert_int_equal(cfg.spill_io, 0);
	GOOD("page-size", "64K");
	assert_int_equal(cfg.page_size, 64ull << 10);
	GOOD("block-tokens", "1");
	assert_int_equal(cfg.block_tokens, 1);
	GOOD("block-tokens", "1024");
	assert_int_equal(cfg.block_tokens, 1024);
	GOOD("max-clients", "4096");
	assert_int_equal(cfg.max_clients, 4096);
	GOOD("max-pins", "4194304");
	assert_int_equal(cfg.max_pins, 4194304);
	GOOD("low-watermark", "0");
	assert_int_equal(cfg.low_watermark, 0);
	GOOD("low-watermark", "90");
	assert_int_equal(cfg.low_watermark, 90);
	GOOD("high-watermark", "95");
	assert_int_equal(cfg.high_watermark, 95);
	GOOD("eviction", "s3fifo");
	assert_int_equal(cfg.eviction, KVD_EVICTION_S3FIFO);
	GOOD("eviction", "clock");
	assert_int_equal(cfg.eviction, KVD_EVICTION_CLOCK);
	GOOD("eviction", "lru");
	assert_int_equal(cfg.eviction, KVD_EVICTION_LRU);
	GOOD("tick-ms", "10000");
	assert_int_equal(cfg.tick_ms, 10000);
	GOOD("socket-mode", "0600");
	assert_int_equal(cfg.socket_mode, 0600);
	GOOD("socket-mode", "777");
	assert_int_equal(cfg.socket_mode, 0777);
	GOOD("hugepages", "on");
	assert_int_equal(cfg.hugepages, KVD_HUGE_ON);
	GOOD("hugepages", "off");
	assert_int_equal(cfg.hugepages, KVD_HUGE_OFF);
	GOOD("hugepages", "auto");
	assert_int_equal(cfg.hugepages, KVD_HUGE_AUTO);
	GOOD("log-level", "debug");
	assert_int_equal(cfg.log_level, KVD_LOG_DEBUG);
	GOOD("log-level", "error");
	assert_int_equal(cfg.log_level, KVD_LOG_ERR);
	GOOD("log-level", "warning");
	assert_int_equal(cfg.log_level, KVD_LOG_WARN);
	GOOD("foreground", "yes");
	assert_true(cfg.foreground);
	GOOD("foreground", "false");
	assert_false(cfg.foreground);
	GOOD("foreground", "");
	assert_true(cfg.foreground);
	GOOD("foreground", "0");
	assert_false(cfg.foreground);
	GOOD("allow-users", "1000, 1001,root");
	assert_int_equal(cfg.n_allow_uid, 3);
	assert_int_equal(cfg.allow_uid[0], 1000);
	assert_int_equal(cfg.allow_uid[1], 1001);
	assert_int_equal(cfg.allow_uid[2], 0);
	GOOD("kv-events", "tcp://*:5557");
	assert_string_equal(cfg.kv_events, "tcp://*:5557");
	GOOD("kv-events", "tcp://[::1]:5557");
	GOOD("kv-events", "ipc:///run/kvcached/events");
	assert_string_equal(cfg.kv_events, "ipc:///run/kvcached/events");
	GOOD("kv-events-replay", "tcp://10.0.0.1:5558");
	assert_string_equal(cfg.kv_events_replay, "tcp://10.0.0.1:5558");
	GOOD("kv-events-replay", "");
	assert_string_equal(cfg.kv_events_replay, "");
	GOOD("kv-events-topic", "kv@pod-7@{model}");
	assert_string_equal(cfg.kv_events_topic, "kv@pod-7@{model}");
	GOOD("kv-events-topic", "");		/* vLLM's default: no topic */
	GOOD("kv-events-buffer", "0");
	assert_int_equal(cfg.kv_events_buffer, 0);
	GOOD("kv-events-hwm", "1000000");
	assert_int_equal(cfg.kv_events_hwm, 1000000);
	GOOD("kv-events-stall-ms", "0");
	assert_int_equal(cfg.kv_events_stall_ms, 0);
	GOOD("kv-events-hash", "int64");
	assert_int_equal(cfg.kv_events_hash, KVD_EVENTS_HASH_INT64);
	GOOD("kv-events-hash", "bytes");
	assert_int_equal(cfg.kv_events_hash, KVD_EVENTS_HASH_BYTES);
	GOOD("kv-events-format", "array");
	assert_int_equal(cfg.kv_events_format, KVD_EVENTS_FORMAT_ARRAY);
	GOOD("kv-events-host-medium", "CPU_PINNED");
	assert_string_equal(cfg.kv_events_host_medium, "CPU_PINNED");
	GOOD("kv-events-mode", "connect");
	assert_true(cfg.kv_events_connect);
	GOOD("kv-events", "");		/* off again */
	assert_string_equal(cfg.kv_events, "");
	GOOD("allow-groups", "root,27");
	assert_int_equal(cfg.n_allow_gid, 2);
	assert_int_equal(cfg.allow_gid[0], 0);
	assert_int_equal(cfg.allow_gid[1], 27);
#undef GOOD
}

static void test_set_bad(void **state)
{
	static const struct {
		const char *key, *val;
	} bad[] = {
		{ "socket", "" },
		{ "socket", "/tmp/012345678901234567890123456789012345678901234567890123456789"
			    "0123456789012345678901234567890123456789012345.sock" },
		{ "pool", "gpu" },
		{ "spill-dir", "relative/spill" },
		{ "spill-size", "0" },
		{ "spill-size", "lots" },
		{ "spill-io", "sync" },
		{ "pool", "Host" },
		{ "gpu", "x" },
		{ "gpu", "1024" },
		{ "gpu", "-1" },
		{ "gpu", "" },
		{ "pool-size", "10X" },
		{ "pool-size", "" },
		{ "page-size", "-1" },
		{ "block-tokens", "0" },
		{ "block-tokens", "1025" },
		{ "max-share", "101%" },
		{ "max-share", "%" },
		{ "max-share", "0%" },
		{ "max-share", "50%%" },
		{ "low-watermark", "-5%" },
		{ "block-tokens", "16x" },
		{ "block-tokens", "-16" },
		{ "block-tokens", "" },
		{ "max-clients", "0" },
		{ "max-clients", "4097" },
		{ "max-pins", "0" },
		{ "max-pins", "4194305" },
		{ "max-pins", "99999999999999999999" },
		{ "low-watermark", "91" },
		{ "high-watermark", "96" },
		{ "high-watermark", "ten" },
		{ "eviction", "LRU" },
		{ "eviction", "" },
		{ "eviction", "arc" },
		{ "tick-ms", "0" },
		{ "tick-ms", "10001" },
		{ "socket-mode", "0999" },
		{ "socket-mode", "1777" },
		{ "socket-mode", "rw" },
		{ "hugepages", "yes" },
		{ "log-level", "verbose" },
		{ "log-level", "" },
		{ "foreground", "maybe" },
		{ "allow-users", "kvt-no-such-user-zz" },
		{ "allow-groups", "kvt-no-such-group-zz" },
		{ "allow-users", "4294967295" },
		{ "kv-events", "udp://*:5557" },
		{ "kv-events", "tcp://*" },
		{ "kv-events", "tcp://:5557" },
		{ "kv-events", "tcp://*:65536" },
		{ "kv-events", "ipc://" },
		{ "kv-events", "ipc:///tmp/a b" },
		{ "kv-events-replay", "inproc://x" },
		{ "kv-events-topic", "kv@{pod}" },
		{ "kv-events-topic", "kv {model}" },
		{ "kv-events-topic", "kv}" },
		{ "kv-events-buffer", "1000001" },
		{ "kv-events-hwm", "0" },
		{ "kv-events-stall-ms", "-1" },
		{ "kv-events-hash", "int" },
		{ "kv-events-format", "tuple" },
		{ "kv-events-host-medium", "" },
		{ "kv-events-host-medium", "host memory" },
		{ "kv-events-host-medium", "CPU_PINNED_MEMORY" },
		{ "kv-events-mode", "listen" },
	};
	struct kvd_config cfg, before;
	struct cap c;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kvd_config_defaults(&cfg);
		before = cfg;
		if (set_cap(&cfg, &c, bad[i].key, bad[i].val, "") != -1)
			fail_msg("%s = \"%s\" accepted", bad[i].key, bad[i].val);
		/* The message names the flag, and the value where it helps. */
		assert_has(c.text, bad[i].key);
		if (strncmp(bad[i].key, "allow-", 6))
			assert_has(c.text, "--");
		/* A refused scalar value is not applied. */
		if (strncmp(bad[i].key, "allow-", 6))
			assert_memory_equal(&cfg, &before, sizeof(cfg));
	}
	/* Same through a config file: the message names file:line. */
	kvd_config_defaults(&cfg);
	assert_int_equal(set_cap(&cfg, &c, "tick-ms", "0", "my.conf:7"), -1);
	assert_has(c.text, "my.conf:7");
	assert_has(c.text, "tick-ms");
	assert_has(c.text, "0");
}

static void test_set_unknown(void **state)
{
	struct kvd_config cfg;
	struct cap c;

	(void)state;
	kvd_config_defaults(&cfg);
	assert_int_equal(set_cap(&cfg, &c, "pool_size", "1G", ""), -1);
	assert_has(c.text, "pool_size");
	assert_has(c.text, "unknown");
	assert_int_equal(set_cap(&cfg, &c, "colour", "blue", "x.conf:2"), -1);
	assert_has(c.text, "x.conf:2");
	assert_has(c.text, "colour");
	assert_int_equal(set_cap(&cfg, &c, "", "", "x.conf:3"), -1);
}

static void test_allow_lists(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	char list[400];
	int i, n = 0;

	(void)state;
	kvd_config_defaults(&cfg);
	for (i = 0; i < KVD_MAX_ALLOW; i++)
		n += snprintf(list + n, sizeof(list) - n, "%s%d", i ? "," : "", 2000 + i);
	assert_int_equal(set_cap(&cfg, &c, "allow-users", list, ""), 0);
	assert_int_equal(cfg.n_allow_uid, KVD_MAX_ALLOW);
	assert_int_equal(cfg.allow_uid[KVD_MAX_ALLOW - 1], 2000 + KVD_MAX_ALLOW - 1);
	snprintf(list + n, sizeof(list) - n, ",9999");
	assert_int_equal(set_cap(&cfg, &c, "allow-groups", list, "f:1"), -1);
	assert_has(c.text, "f:1");
	assert_has(c.text, "more than");
	/* A list replaces the previous one. */
	assert_int_equal(set_cap(&cfg, &c, "allow-users", "5", ""), 0);
	assert_int_equal(cfg.n_allow_uid, 1);
	assert_int_equal(cfg.allow_uid[0], 5);
}

/* ------------------------------------------------------------ files */

static void test_file_good(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	const char *path;
	int rc;

	(void)state;
	path = write_file(
		"# kvcached test config\n"
		"\n"
		"   \n"
		"pool-size = 2G\n"
		"  page-size=64K  \n"
		"\t# an indented comment = with an equals sign\n"
		"block-tokens\t=\t32\n"
		"socket = /tmp/with=equals.sock\n"
		"log-level = debug\r\n"
		"foreground =\n"
		"high-watermark = 20");	/* no newline at the end */
	kvd_config_defaults(&cfg);
	cap_begin(&c, 2);
	rc = kvd_config_file(&cfg, path);
	cap_end(&c);
	unlink(path);
	assert_int_equal(rc, 0);
	assert_string_equal(c.text, "");
	assert_int_equal(cfg.pool_size, 2ull << 30);
	assert_int_equal(cfg.page_size, 64ull << 10);
	assert_int_equal(cfg.block_tokens, 32);
	assert_string_equal(cfg.socket, "/tmp/with=equals.sock");
	assert_int_equal(cfg.log_level, KVD_LOG_DEBUG);
	assert_true(cfg.foreground);
	assert_int_equal(cfg.high_watermark, 20);
}

/* The file's lines up to the bad one apply; the message names file:line. */
static void expect_file_error(const char *text, int line, const char *want)
{
	struct kvd_config cfg;
	struct cap c;
	char where[128];
	const char *path;
	int rc;

	path = write_file(text);
	snprintf(where, sizeof(where), "%s:%d", path, line);
	kvd_config_defaults(&cfg);
	cap_begin(&c, 2);
	rc = kvd_config_file(&cfg, path);
	cap_end(&c);
	unlink(path);
	assert_int_equal(rc, -1);
	assert_has(c.text, where);
	assert_has(c.text, want);
}

static void test_file_errors(void **state)
{
	static char longline[6000];

	(void)state;
	expect_file_error("# ok\npool-size = 1G\n\npool-size = 10X\nmax-pins = 5\n", 4,
			  "pool-size");
	expect_file_error("pool-size = 10X\n", 1, "10X");
	expect_file_error("# c\nblock-tokens = 2000\n", 2, "block-tokens");
	expect_file_error("pool-size = 1G\nbogus-key = 3\n", 2, "bogus-key");
	expect_file_error("pool-size 1G\n", 1, "key = value");
	expect_file_error("\n\nconfig = /etc/other.conf\n", 3, "cannot be set");
	expect_file_error("pool-size =\n", 1, "pool-size");
	memset(longline, 'x', sizeof(longline) - 1);
	memcpy(longline, "# ", 2);
	expect_file_error(longline, 1, "longer");
}

/* Lines before the bad one were applied, and nothing after it. */
static void test_file_stops_at_error(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	const char *path;
	int rc;

	(void)state;
	path = write_file("tick-ms = 77\nmax-clients = 0\nmax-pins = 5\n");
	kvd_config_defaults(&cfg);
	cap_begin(&c, 2);
	rc = kvd_config_file(&cfg, path);
	cap_end(&c);
	unlink(path);
	assert_int_equal(rc, -1);
	assert_int_equal(cfg.tick_ms, 77);
	assert_int_equal(cfg.max_clients, 64);
	assert_int_equal(cfg.max_pins, 8192);
}

static void test_file_missing(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	int rc;

	(void)state;
	kvd_config_defaults(&cfg);
	cap_begin(&c, 2);
	rc = kvd_config_file(&cfg, "/nonexistent/kvt/kvcached.conf");
	cap_end(&c);
	assert_int_equal(rc, -1);
	assert_has(c.text, "/nonexistent/kvt/kvcached.conf");
}

/* ------------------------------------------------------------ checks */

static void check_is(struct kvd_config *cfg, int rc, const char *want)
{
	struct cap c;
	int r;

	cap_begin(&c, 2);
	r = kvd_config_check(cfg);
	cap_end(&c);
	assert_int_equal(r, rc);
	if (want)
		assert_has(c.text, want);
}

static void test_check(void **state)
{
	struct kvd_config cfg;

	(void)state;
	kvd_config_defaults(&cfg);
	check_is(&cfg, 0, NULL);

	cfg.page_size = 4096 * 3 + 512;
	check_is(&cfg, -1, "page-size");
	cfg.page_size = 0;
	check_is(&cfg, -1, "page-size");
	cfg.page_size = 4096 * 3;
	check_is(&cfg, 0, NULL);
	cfg.pool_size = 8ull << 30;
	cfg.page_size = (1ull << 30) + 4096;	/* over one spill I/O */
	check_is(&cfg, -1, "page-size");
	cfg.page_size = 1ull << 30;
	check_is(&cfg, 0, NULL);

	kvd_config_defaults(&cfg);
	cfg.pool_size = 2 * cfg.page_size - 1;
	check_is(&cfg, -1, "pool-size");
	cfg.pool_size = 0;
	check_is(&cfg, -1, "pool-size");
	cfg.pool_size = 2 * cfg.page_size;
	check_is(&cfg, 0, NULL);
	/* More than 2^30 pages. */
	cfg.page_size = 4096;
	cfg.pool_size = 4096ull << 31;
	check_is(&cfg, -1, "pool-size");

	kvd_config_defaults(&cfg);
	cfg.low_watermark = 30;
	cfg.high_watermark = 29;
	check_is(&cfg, -1, "high-watermark");
	cfg.high_watermark = 30;
	check_is(&cfg, 0, NULL);

	kvd_config_defaults(&cfg);
	cfg.socket[0] = 0;
	check_is(&cfg, -1, "socket");

	/* A replay endpoint needs the PUB endpoint, and another one. */
	kvd_config_defaults(&cfg);
	strcpy(cfg.kv_events_replay, "tcp://*:5558");
	check_is(&cfg, -1, "kv-events-replay");
	strcpy(cfg.kv_events, "tcp://*:5558");
	check_is(&cfg, -1, "same endpoint");
	strcpy(cfg.kv_events, "tcp://*:5557");
	check_is(&cfg, 0, NULL);
}

/* ------------------------------------------------------------ arguments */

static int args(struct kvd_config *cfg, struct cap *c, int fd, char **argv)
{
	int argc = 0, rc;

	while (argv[argc])
		argc++;
	kvd_config_defaults(cfg);
	cap_begin(c, fd);
	rc = kvd_config_args(cfg, argc, argv);
	cap_end(c);
	return rc;
}

static void test_args_help(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	char *help[] = { "kvcached", "--help", NULL };
	char *h[] = { "kvcached", "--pool-size", "2G", "-h", NULL };
	char *version[] = { "kvcached", "--version", NULL };

	(void)state;
	assert_int_equal(args(&cfg, &c, 1, help), 1);
	assert_has(c.text, "usage: kvcached");
	assert_has(c.text, "--pool-size");
	assert_int_equal(args(&cfg, &c, 1, h), 1);
	assert_has(c.text, "usage: kvcached");
	assert_int_equal(args(&cfg, &c, 1, version), 1);
	assert_has(c.text, KVD_VERSION);
}

static void test_args_forms(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	char *eq[] = { "kvcached", "--pool-size=2G", NULL };
	char *sp[] = { "kvcached", "--pool-size", "2G", NULL };
	char *many[] = { "kvcached", "--socket", "/tmp/kvt-a.sock", "--foreground",
			 "--page-size=64K", "--max-pins", "100", "--low-watermark=1",
			 "--high-watermark", "2", "--allow-users=7,8", "--foreground=false",
			 NULL };
	char *none[] = { "kvcached", NULL };

	(void)state;
	assert_int_equal(args(&cfg, &c, 2, eq), 0);
	assert_int_equal(cfg.pool_size, 2ull << 30);
	assert_int_equal(args(&cfg, &c, 2, sp), 0);
	assert_int_equal(cfg.pool_size, 2ull << 30);
	assert_int_equal(args(&cfg, &c, 2, many), 0);
	assert_string_equal(c.text, "");
	assert_string_equal(cfg.socket, "/tmp/kvt-a.sock");
	assert_int_equal(cfg.page_size, 64ull << 10);
	assert_int_equal(cfg.max_pins, 100);
	assert_int_equal(cfg.low_watermark, 1);
	assert_int_equal(cfg.high_watermark, 2);
	assert_int_equal(cfg.n_allow_uid, 2);
	assert_int_equal(cfg.allow_uid[1], 8);
	assert_false(cfg.foreground);	/* the later flag wins */
	assert_int_equal(args(&cfg, &c, 2, none), 0);
	assert_int_equal(cfg.pool_size, 1ull << 30);
}

/* The remote tier's keys: values, refusals that name the problem, the
 * secret-or-insecure check, and --remote-insecure as a bare flag. */
static void test_remote(void **state)
{
	static const struct {
		const char *key, *val, *why;
	} bad[] = {
		{ "remote", "redis:10.0.0.1:6379", "must start with memcached:" },
		{ "remote", "memcached:", "no server" },
		{ "remote", "memcached:10.0.0.1", "HOST:PORT" },
		{ "remote", "memcached:10.0.0.1:0", "port must be" },
		{ "remote", "memcached:10.0.0.1:65536", "port must be" },
		{ "remote", "memcached:10.0.0.1:11211,", "empty server entry" },
		{ "remote", "memcached:[::1:11211", "[ADDR]:PORT" },
		{ "remote", "memcached:[zz]:1", "IPv6" },
		{ "remote", "memcached:a b:1", "host name" },
		{ "remote-write", "always", "publish or evict" },
		{ "remote-secret-file", "secret", "absolute" },
		{ "remote-insecure", "maybe", "true or false" },
		{ "remote-timeout-ms", "0", "1..60000" },
		{ "remote-timeout-ms", "60001", "1..60000" },
		{ "remote-prefix", "", "letters, digits" },
		{ "remote-prefix", "a:b", "letters, digits" },
	};
	char *flag[] = { "kvcached", "--remote", "memcached:127.0.0.1:1", "--remote-insecure",
			 "--remote-timeout-ms", "250", NULL };
	char *nosecret[] = { "kvcached", "--remote", "memcached:127.0.0.1:1", NULL };
	char many[2048] = "memcached:";
	struct kvd_config cfg;
	struct cap c;
	size_t i;

	(void)state;
#define GOOD(k, v) do { if (set_cap(&cfg, &c, k, v, "")) \
		fail_msg("%s = %s refused: %s", k, v, c.text); } while (0)
	kvd_config_defaults(&cfg);
	assert_string_equal(cfg.remote, "");
	assert_int_equal(cfg.remote_write, KVD_REMOTE_PUBLISH);
	assert_int_equal(cfg.remote_timeout_ms, 100);
	assert_string_equal(cfg.remote_prefix, "kvc");
	GOOD("remote", "memcached:10.0.0.1:11211,[fe80::1]:11212,/run/memcached.sock,cache-2:1");
	assert_string_equal(cfg.remote,
			    "memcached:10.0.0.1:11211,[fe80::1]:11212,/run/memcached.sock,cache-2:1");
	GOOD("remote-write", "evict");
	assert_int_equal(cfg.remote_write, KVD_REMOTE_EVICT);
	GOOD("remote-secret-file", "/etc/kvcached/secret");
	assert_string_equal(cfg.remote_secret_file, "/etc/kvcached/secret");
	GOOD("remote-timeout-ms", "60000");
	assert_int_equal(cfg.remote_timeout_ms, 60000);
	GOOD("remote-prefix", "fleet-1.a_b");
	assert_string_equal(cfg.remote_prefix, "fleet-1.a_b");
	check_is(&cfg, 0, NULL);
	GOOD("remote", "");	/* off again */
	assert_string_equal(cfg.remote, "");
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (!set_cap(&cfg, &c, bad[i].key, bad[i].val, ""))
			fail_msg("%s = %s accepted", bad[i].key, bad[i].val);
		assert_has(c.text, bad[i].why);
	}
	/* More than 32 servers. */
	for (i = 0; i < 33; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sh%zu:1", i ? "," : "", i);
	assert_int_not_equal(set_cap(&cfg, &c, "remote", many, ""), 0);
	assert_has(c.text, "more servers");
	/* Without a secret file, only with --remote-insecure. */
	assert_int_equal(args(&cfg, &c, 2, nosecret), -1);
	assert_has(c.text, "needs remote-secret-file");
	assert_int_equal(args(&cfg, &c, 2, flag), 0);
	assert_true(cfg.remote_insecure);
	assert_int_equal(cfg.remote_timeout_ms, 250);
#undef GOOD
}

static void test_args_config_file(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	char *path = strdup(write_file("pool-size = 1G\ntick-ms = 50\nmax-clients = 8\n"));
	char arg[128];

	(void)state;
	assert_non_null(path);
	snprintf(arg, sizeof(arg), "--config=%s", path);
	{
		char *only[] = { "kvcached", "--config", path, NULL };
		char *after[] = { "kvcached", "--config", path, "--pool-size", "2G", NULL };
		char *before[] = { "kvcached", "--pool-size=2G", "--tick-ms", "7", arg, NULL };

		assert_int_equal(args(&cfg, &c, 2, only), 0);
		assert_int_equal(cfg.pool_size, 1ull << 30);
		assert_int_equal(cfg.tick_ms, 50);
		assert_int_equal(cfg.max_clients, 8);
		/* Flags win over the file, after it or before it. */
		assert_int_equal(args(&cfg, &c, 2, after), 0);
		assert_int_equal(cfg.pool_size, 2ull << 30);
		assert_int_equal(cfg.tick_ms, 50);
		assert_int_equal(args(&cfg, &c, 2, before), 0);
		assert_int_equal(cfg.pool_size, 2ull << 30);
		assert_int_equal(cfg.tick_ms, 7);
		assert_int_equal(cfg.max_clients, 8);
	}
	unlink(path);
	{
		char *gone[] = { "kvcached", "--config", path, NULL };
		char *noval[] = { "kvcached", "--pool-size=2G", "--config", NULL };

		assert_int_equal(args(&cfg, &c, 2, gone), -1);
		assert_has(c.text, path);
		assert_int_equal(args(&cfg, &c, 2, noval), -1);
		assert_has(c.text, "--config");
	}
	free(path);
}

static void test_args_errors(void **state)
{
	struct kvd_config cfg;
	struct cap c;
	char *unknown[] = { "kvcached", "--bogus", "1", NULL };
	char *unknown_eq[] = { "kvcached", "--bogus=1", NULL };
	char *missing[] = { "kvcached", "--pool-size", NULL };
	char *missing2[] = { "kvcached", "--foreground", "--socket", NULL };
	char *badval[] = { "kvcached", "--pool-size", "10X", NULL };
	char *stray[] = { "kvcached", "pool-size=1G", NULL };
	char *single[] = { "kvcached", "-p", NULL };
	char *dashes[] = { "kvcached", "--", NULL };
	char *check[] = { "kvcached", "--pool-size=4K", NULL };
	char *wm[] = { "kvcached", "--low-watermark=50", "--high-watermark=40", NULL };

	(void)state;
	assert_int_equal(args(&cfg, &c, 2, unknown), -1);
	assert_has(c.text, "--bogus");
	assert_has(c.text, "unknown");
	assert_int_equal(args(&cfg, &c, 2, unknown_eq), -1);
	assert_has(c.text, "bogus");
	assert_int_equal(args(&cfg, &c, 2, missing), -1);
	assert_has(c.text, "--pool-size");
	assert_int_equal(args(&cfg, &c, 2, missing2), -1);
	assert_has(c.text, "--socket");
	assert_int_equal(args(&cfg, &c, 2, badval), -1);
	assert_has(c.text, "--pool-size");
	assert_has(c.text, "10X");
	assert_int_equal(args(&cfg, &c, 2, stray), -1);
	assert_has(c.text, "pool-size=1G");
	assert_int_equal(args(&cfg, &c, 2, single), -1);
	assert_int_equal(args(&cfg, &c, 2, dashes), -1);
	/* The cross-field checks run on the result. */
	assert_int_equal(args(&cfg, &c, 2, check), -1);
	assert_has(c.text, "pool-size");
	assert_int_equal(args(&cfg, &c, 2, wm), -1);
	assert_has(c.text, "high-watermark");
}

/* A file of the repository (the tests run from its root), NUL-terminated. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long n;

	if (!f)
		fail_msg("%s: %s (run the tests from the repository root)", path, strerror(errno));
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	n = ftell(f);
	assert_true(n > 0);
	rewind(f);
	buf = calloc(1, (size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return buf;
}

/* `word` in text, not as the start of a longer key: what follows is no
 * letter, digit or (escaped) dash; nor is what comes before. */
static bool has_key(const char *text, const char *word)
{
	const char *p;
	size_t n = strlen(word);

	for (p = text; (p = strstr(p, word)); p++) {
		const char *e = p + n;
		char before = p > text ? p[-1] : ' ';

		if (isalnum((unsigned char)before) || before == '-')
			continue;
		if (isalnum((unsigned char)*e) || *e == '-' || (e[0] == '\\' && e[1] == '-'))
			continue;
		return true;
	}
	return false;
}

/* "pool-size" as roff writes it: "pool\-size". */
static void roff_key(char *out, size_t len, const char *prefix, const char *key)
{
	size_t o = (size_t)snprintf(out, len, "%s", prefix);

	for (; *key && o + 3 < len; key++) {
		if (*key == '-')
			out[o++] = '\\';
		out[o++] = *key;
	}
	out[o] = 0;
}

/*
 * Every key of the config table is in --help (which comes from it), in
 * the example config (set or commented) and in both manual pages: the
 * options of kvcached(8) and the keys of kvcached.conf(5).
 */
static void test_keys_documented(void **state)
{
	const char *keys[128];
	char *help[] = { "kvcached", "--help", NULL };
	char *conf = slurp("daemon/kvcached.conf.example");
	char *man8 = slurp("man/kvcached.8.in");
	char *man5 = slurp("man/kvcached.conf.5.in");
	struct kvd_config cfg;
	struct cap c;
	size_t i, n = kvd_config_keys(keys, 128);

	(void)state;
	assert_true(n >= 38 && n <= 128);
	assert_int_equal(args(&cfg, &c, 1, help), 1);
	for (i = 0; i < n; i++) {
		char pat[96];

		snprintf(pat, sizeof(pat), "\n  --%s", keys[i]);
		if (!has_key(c.text, pat + 3))
			fail_msg("--help does not list --%s", keys[i]);
		snprintf(pat, sizeof(pat), "\n%s = ", keys[i]);
		if (!strstr(conf, pat)) {
			snprintf(pat, sizeof(pat), "\n#%s = ", keys[i]);
			if (!strstr(conf, pat))
				fail_msg("daemon/kvcached.conf.example has no line '%s = ...'", keys[i]);
		}
		roff_key(pat, sizeof(pat), "\\-\\-", keys[i]);
		if (!has_key(man8, pat))
			fail_msg("man/kvcached.8.in does not list %s", pat);
		roff_key(pat, sizeof(pat), "", keys[i]);
		if (!has_key(man5, pat))
			fail_msg("man/kvcached.conf.5.in does not list %s", pat);
	}
	/* And nothing there that is no key: every --option of --help. */
	for (const char *h = c.text; (h = strstr(h, "\n  --")); h++) {
		char key[64];
		size_t k = strspn(h + 5, "abcdefghijklmnopqrstuvwxyz-");

		snprintf(key, sizeof(key), "%.*s", (int)k, h + 5);
		if (strcmp(key, "config") && strcmp(key, "help")) {
			for (i = 0; i < n && strcmp(keys[i], key); i++)
				;
			if (i == n)
				fail_msg("--help lists --%s, which is no key of the table", key);
		}
	}
	free(conf);
	free(man8);
	free(man5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_size_good),
		cmocka_unit_test(test_parse_size_bad),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_set_good),
		cmocka_unit_test(test_set_bad),
		cmocka_unit_test(test_set_unknown),
		cmocka_unit_test(test_allow_lists),
		cmocka_unit_test(test_file_good),
		cmocka_unit_test(test_file_errors),
		cmocka_unit_test(test_file_stops_at_error),
		cmocka_unit_test(test_file_missing),
		cmocka_unit_test(test_check),
		cmocka_unit_test(test_args_help),
		cmocka_unit_test(test_args_forms),
		cmocka_unit_test(test_args_config_file),
		cmocka_unit_test(test_remote),
		cmocka_unit_test(test_args_errors),
		cmocka_unit_test(test_keys_documented),
	};

	return cmocka_run_group_tests_name("config", tests, group_setup, group_teardown);
}
