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
 *     so, and a clean stop removes it again.
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_live_socket_checked_before_the_pool),
		cmocka_unit_test(test_metrics_port_taken),
		cmocka_unit_test(test_missing_socket_folder),
	};

	return cmocka_run_group_tests_name("startup", tests, NULL, NULL);
}
