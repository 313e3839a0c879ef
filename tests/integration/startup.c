// SPDX-License-Identifier: MIT
/*
 * startup.c - the order of kvcached's start-up checks, with the real
 * daemon:
 *   - a second daemon on a live socket is refused before it reserves its
 *     pool (asked for a pool no host has, it still names the live socket,
 *     which it could only do if the socket check came first);
 *   - --metrics-listen on a port another program holds fails the start
 *     with our message, and "ready:" is never logged;
 *   - a socket in a missing folder: the folder is created, the log says
 *     so, and a clean stop removes it again; one two folders deep is
 *     refused before the pool;
 *   - a bad value of every setting in a config file names the file, the
 *     line, the key and the value as written, and exits 2, whether the
 *     parse, the cross-field checks or the memory check finds it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"

static void test_live_socket_checked_before_the_pool(void **state)
{
	const char *args[] = { "--socket", NULL, "--pool-size", "64T", "--hugepages", "off",
			       NULL };
	struct kvt_daemon d;
	char out[8192];
	bool live;
	int rc;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	args[1] = d.sock;
	rc = kvt_run(NULL, args, out, sizeof(out));
	live = kvproto_can_connect(d.sock);	/* the first one serves on */
	assert_int_equal(kvt_daemon_stop(&d), 0);
	assert_int_equal(rc, 1);
	if (!strstr(out, "another kvcached is serving it") || strstr(out, "pool-size"))
		fail_msg("not refused for the live socket first:\n%s", out);
	assert_true(live);
}

static void test_metrics_port_taken(void **state)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	char sock[64], listen_at[32], want[96], out[8192];
	const char *args[] = { "--socket", sock, "--pool-size", "1M", "--page-size", "4K",
			       "--hugepages", "off", "--metrics-listen", listen_at, NULL };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 1), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	snprintf(listen_at, sizeof(listen_at), "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
	snprintf(sock, sizeof(sock), "/tmp/kvt-metrics-%d.sock", (int)getpid());
	assert_int_equal(kvt_run(NULL, args, out, sizeof(out)), 1);
	close(fd);
	snprintf(want, sizeof(want), "metrics-listen %s: cannot listen there", listen_at);
	if (!strstr(out, want) || strstr(out, "ready:"))
		fail_msg("want \"%s\" and no \"ready:\" in:\n%s", want, out);
	assert_non_null(strstr(out, "another program serves that port"));
	assert_int_equal(access(sock, F_OK), -1);	/* nothing left behind */
}

/* --help's wrapped lines as one: runs of blanks and newlines to one space. */
static void squash(char *s)
{
	char *o = s;
	bool blank = false;

	for (; *s; s++) {
		if (*s == ' ' || *s == '\n') {
			blank = true;
			continue;
		}
		if (blank && o != s)
			*o++ = ' ';
		blank = false;
		*o++ = *s;
	}
	*o = 0;
}

static void test_missing_socket_folder(void **state)
{
	char dir[] = "/tmp/kvt-sockdir.XXXXXX", sub[64], sock[96], log[96], out[8192];
	const char *help[] = { "--help", NULL };
	const char *argv[64];
	struct stat st;
	int tries, status, fd;
	FILE *f;
	pid_t p;

	(void)state;
	/* --help says what happens. */
	assert_int_equal(kvt_run(NULL, help, out, sizeof(out)), 0);
	squash(out);
	assert_non_null(strstr(out, "a missing folder is created (mode 0755, said in the log) and removed at a clean stop"));
	assert_non_null(mkdtemp(dir));
	snprintf(sub, sizeof(sub), "%s/run", dir);
	snprintf(sock, sizeof(sock), "%s/kvcached.sock", sub);
	snprintf(log, sizeof(log), "%s/log", dir);
	kvt_daemon_argv(sock, NULL, argv, 64);
	p = fork();
	assert_true(p >= 0);
	if (!p) {
		fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	for (tries = 0; tries < 2000 && !kvproto_can_connect(sock); tries++)
		usleep(10000);
	assert_true(kvproto_can_connect(sock));
	assert_int_equal(stat(sub, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(kill(p, SIGTERM), 0);
	assert_int_equal(waitpid(p, &status, 0), p);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	f = fopen(log, "r");
	assert_non_null(f);
	memset(out, 0, sizeof(out));
	assert_true(fread(out, 1, sizeof(out) - 1, f) > 0);
	fclose(f);
	if (!strstr(out, "did not exist: created it (mode 0755)"))
		fail_msg("the log does not say the folder was made:\n%s", out);
	assert_int_equal(stat(sub, &st), -1);	/* removed at the clean stop */
	unlink(log);
	assert_int_equal(rmdir(dir), 0);
}

/*
 * A bad value for every key --help lists (a key without one here fails the
 * test: add it), then values only the checks after the parse can refuse.
 */
static const struct bad_setting {
	const char *key, *value, *why;
} bad_settings[] = {
	{ "socket", "/tmp/kvt-0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789/s",
	  "longer than 107 bytes" },
	{ "pool", "tpu", "must be host or cuda" },
	{ "gpu", "1024", "0..1023" },
	{ "pool-size", "10X", "not a size" },
	{ "page-size", "4Q", "not a size" },
	{ "block-tokens", "2000", "1..1024" },
	{ "max-clients", "0", "1..4096" },
	{ "max-per-process", "0", "1..4096" },
	{ "max-pins", "0", "1..4194304" },
	{ "max-announced", "-1", "0..4194304" },
	{ "max-share", "101%", "1..100" },
	{ "tenant-share", "0", "1..100" },
	{ "namespace-share", "200%", "1..100" },
	{ "tenant", "acme salt=x share=0", "share= must be a percentage" },
	{ "hello-timeout-ms", "0", "1..600000" },
	{ "slice-timeout-ms", "0", "1..3600000" },
	{ "low-watermark", "91", "0..90" },
	{ "high-watermark", "96", "0..95" },
	{ "eviction", "fifo", "lru, s3fifo or clock" },
	{ "pin-barrier", "none", "auto or fence" },
	{ "allow-users", "root,kvt-no-such-user", "no such user 'kvt-no-such-user'" },
	{ "allow-groups", "kvt-no-such-group", "no such group 'kvt-no-such-group'" },
	{ "socket-mode", "0999", "octal mode" },
	{ "hugepages", "maybe", "auto, on or off" },
	{ "log-level", "loud", "error, warning, info or debug" },
	{ "tick-ms", "0", "1..10000" },
	{ "spill-dir", "relative/spill", "absolute path" },
	{ "spill-size", "0", "non-zero" },
	{ "spill-io", "aio", "auto, uring or threads" },
	{ "metrics-listen", "localhost", "IP:PORT" },
	{ "kv-events", "udp://x:1", "ZMQ endpoint" },
	{ "kv-events-replay", "udp://x:1", "ZMQ endpoint" },
	{ "kv-events-buffer", "1000001", "0..1000000" },
	{ "kv-events-topic", "kv@{user}", "{host} or {model}" },
	{ "kv-events-hash", "md5", "uint64, int64 or bytes" },
	{ "kv-events-format", "json", "must be array or map" },
	{ "kv-events-host-medium", "HBM!", "only letters, digits" },
	{ "kv-events-hwm", "0", "1..1000000" },
	{ "kv-events-stall-ms", "3600001", "0..3600000" },
	{ "kv-events-mode", "listen", "bind or connect" },
	{ "remote", "redis:127.0.0.1:1", "memcached" },
	{ "remote-write", "never", "publish or evict" },
	{ "remote-secret-file", "relative.secret", "absolute path" },
	{ "remote-insecure", "maybe", "true or false" },
	{ "remote-timeout-ms", "0", "1..60000" },
	{ "remote-prefix", "a b", "letters, digits" },
	{ "foreground", "maybe", "true or false" },
	/* Found after the parse: by the checks, or before the pool. */
	{ "page-size", "5000", "must be a non-zero multiple of 4096" },
	{ "page-size", "6K", "must be a non-zero multiple of 4096" },
	{ "page-size", "2G", "more than 1G" },
	{ "pool-size", "4K", "fewer than 2 pages of page-size 2M (the default)" },
	{ "pool-size", "4T", "more than the memory available to kvcached" },
	{ "high-watermark", "3", "below low-watermark 5 (the default)" },
	{ "kv-events-replay", "tcp://127.0.0.1:5558", "needs kv-events" },
	{ "remote", "memcached:127.0.0.1:1", "needs remote-secret-file" },
	{ "socket", "/tmp/kvt-no-such-dir/run/kvcached.sock", "kvcached creates the socket's own folder only" },
};

static void test_bad_setting_every_key(void **state)
{
	const char *help[] = { "--help", NULL };
	char path[] = "/tmp/kvt-badconf.XXXXXX", text[512], want[512], help_out[16384];
	char out[8192], missing[1024] = "", wrong[16384] = "";
	const char *args[] = { "--config", path, NULL };
	size_t i, nkeys = 0;
	const char *h;
	int fd, rc;

	(void)state;
	assert_int_equal(kvt_run(NULL, help, help_out, sizeof(help_out)), 0);
	/* Every key --help lists has a bad value above. */
	for (h = help_out; (h = strstr(h, "\n  --")); h++) {
		char key[64];
		bool found = false;

		if (sscanf(h + 5, "%63[a-z0-9-]", key) != 1 || !strcmp(key, "config") ||
		    !strcmp(key, "help"))
			continue;
		nkeys++;
		for (i = 0; i < sizeof(bad_settings) / sizeof(bad_settings[0]); i++)
			found |= !strcmp(bad_settings[i].key, key);
		if (!found)
			snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
				 " %s", key);
	}
	if (missing[0])
		fail_msg("keys with no bad value in tests/integration/startup.c:%s", missing);
	assert_true(nkeys >= 40);
	fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	for (i = 0; i < sizeof(bad_settings) / sizeof(bad_settings[0]); i++) {
		const struct bad_setting *b = &bad_settings[i];
		FILE *f = fopen(path, "w");

		/* Line 3; a socket of our own unless the key is the socket. */
		assert_non_null(f);
		snprintf(text, sizeof(text), "# kvcached test config\n%s\n%s = %s\n",
			 strcmp(b->key, "socket") ? "socket = /tmp/kvt-badconf-nodir/kvcached.sock" :
			 "hugepages = off", b->key, b->value);
		assert_true(fputs(text, f) >= 0);
		assert_int_equal(fclose(f), 0);
		rc = kvt_run(NULL, args, out, sizeof(out));
		snprintf(want, sizeof(want), "%s:3: %s %s: ", path, b->key, b->value);
		/* Refused before the pool is reserved (its log line). */
		if (rc != 2 || !strstr(out, want) || !strstr(out, b->why) ||
		    strstr(out, "pool: host memory"))
			snprintf(wrong + strlen(wrong), sizeof(wrong) - strlen(wrong),
				 "%s = %s: exit %d (want 2), want \"%s...%s\" in:\n%s\n", b->key,
				 b->value, rc, want, b->why, out);
	}
	unlink(path);
	if (wrong[0])
		fail_msg("%s", wrong);
	/* Flags are echoed as written too. */
	{
		const char *a[] = { "--page-size", "6K", NULL };

		assert_int_equal(kvt_run(NULL, a, out, sizeof(out)), 2);
		assert_non_null(strstr(out, "--page-size 6K: must be a non-zero multiple of 4096"));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_live_socket_checked_before_the_pool),
		cmocka_unit_test(test_metrics_port_taken),
		cmocka_unit_test(test_missing_socket_folder),
		cmocka_unit_test(test_bad_setting_every_key),
	};

	return cmocka_run_group_tests_name("startup", tests, NULL, NULL);
}
