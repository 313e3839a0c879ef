// SPDX-License-Identifier: MIT
/*
 * signals.c - who takes kvcached's SIGTERM, SIGINT and SIGHUP: only the
 * event loop's signalfd, even in threads the daemon does not start itself.
 *
 * The CUDA driver starts threads when a cuda pool opens (issue #32: such a
 * daemon died of SIGTERM with status 143 and left its socket, because the
 * kernel handed the signal to a driver thread that did not block it). No
 * GPU here, so the daemon runs under tests/preload/poolthread.so, which
 * starts a thread at the same place (the pool's memfd, in kvd_pool_open)
 * and in the same way (a thread the daemon never sees, inheriting the main
 * thread's mask at that moment). Checked: every thread's SigBlk in
 * /proc/<pid>/task/<tid>/status holds SIGTERM, SIGINT and SIGHUP; a SIGTERM
 * to the process then stops it cleanly (status 0, socket removed), and so
 * does a SIGINT.
 *
 * What this proves: any thread started between the start of main() and
 * the signalfd (where the driver starts its threads) takes none of these
 * signals. What it does not: a driver thread that unblocks signals itself
 * (none is known to); `.gpu/check vllm` stops real cuda-pool daemons and
 * prints their exit status.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"

/* The shim next to the test binaries: $BUILD/tests/preload/poolthread.so. */
static const char *shim(void)
{
	static char path[1024];
	const char *b = getenv("BUILD");
	char cwd[512] = ".";

	b = b && *b ? b : "build";
	if (b[0] != '/' && !getcwd(cwd, sizeof(cwd)))
		strcpy(cwd, ".");
	snprintf(path, sizeof(path), "%s%s%.400s/tests/preload/poolthread.so",
		 b[0] == '/' ? "" : cwd, b[0] == '/' ? "" : "/", b);
	return path;
}

/* Start the daemon with the shim preloaded (ASan builds: it comes before
 * the sanitizer's runtime, which must be told that is fine). */
static void start(struct kvt_daemon *d)
{
	char asan[512];
	const char *old = getenv("ASAN_OPTIONS");

	assert_int_equal(access(shim(), R_OK), 0);
	setenv("LD_PRELOAD", shim(), 1);
	snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", old ? old : "",
		 old && *old ? ":" : "");
	setenv("ASAN_OPTIONS", asan, 1);
	assert_int_equal(kvt_daemon_start(d, NULL), 0);
	unsetenv("LD_PRELOAD");
	if (old)
		setenv("ASAN_OPTIONS", old, 1);
	else
		unsetenv("ASAN_OPTIONS");
}

/* Each thread's name and blocked-signal mask; returns how many threads,
 * and whether the shim's thread was among them. */
static int masks(pid_t pid, bool *early_seen, bool *all_block)
{
	char dir[64], path[384], line[256], comm[64];
	struct dirent *e;
	int n = 0;
	DIR *dp;

	*early_seen = false;
	*all_block = true;
	snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
	dp = opendir(dir);
	assert_non_null(dp);
	while ((e = readdir(dp))) {
		unsigned long long blk = 0;
		bool got = false;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s/status", dir, e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;	/* the thread ended meanwhile */
		comm[0] = 0;
		while (fgets(line, sizeof(line), f)) {
			if (!strncmp(line, "Name:", 5))
				sscanf(line + 5, " %63s", comm);
			if (!strncmp(line, "SigBlk:", 7))
				got = sscanf(line + 7, " %llx", &blk) == 1;
		}
		fclose(f);
		if (!got)
			continue;
		n++;
		if (!strcmp(comm, "kvt-early"))
			*early_seen = true;
		if (!(blk & (1ull << (SIGTERM - 1))) || !(blk & (1ull << (SIGINT - 1))) ||
		    !(blk & (1ull << (SIGHUP - 1)))) {
			*all_block = false;
			if (!strcmp(comm, "kvt-early"))
				print_message("thread %s (%s) takes signals: SigBlk %016llx\n",
					      e->d_name, comm, blk);
		}
	}
	closedir(dp);
	return n;
}

static void stops_cleanly_on(int sig)
{
	struct kvt_daemon d;
	bool early, blocked, sock_gone;
	struct stat st;
	int status, threads, tries;
	pid_t w;

	start(&d);
	/* The shim's thread names itself once it runs with its own mask. */
	for (tries = 0; (threads = masks(d.pid, &early, &blocked)) >= 0 && !early && tries < 500;
	     tries++)
		usleep(10000);
	/* The signal first, the checks after: a failed check must not leave
	 * the daemon running. */
	assert_int_equal(kill(d.pid, sig), 0);
	w = waitpid(d.pid, &status, 0);
	d.pid = 0;
	sock_gone = stat(d.sock, &st) == -1;
	assert_int_equal(w, w > 0 ? w : -1);
	assert_true(threads >= 2);
	assert_true(early);	/* else this proves nothing */
	if (!WIFEXITED(status)) {
		kvt_daemon_stop(&d);
		fail_msg("%s killed the daemon (signal %d) instead of stopping it",
			 strsignal(sig), WIFSIGNALED(status) ? WTERMSIG(status) : -1);
	}
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_true(kvt_log_has(&d, "stopped cleanly"));
	assert_true(sock_gone);	/* a clean stop removes it */
	assert_true(blocked);
	assert_int_equal(kvt_daemon_stop(&d), -1);	/* its folder only */
}

static void test_sigterm_with_an_early_thread(void **state)
{
	(void)state;
	stops_cleanly_on(SIGTERM);
}

static void test_sigint_with_an_early_thread(void **state)
{
	(void)state;
	stops_cleanly_on(SIGINT);
}

/*
 * The death signal the test harness gives every daemon it starts: a test
 * killed, or one whose failed assertion skipped its kvt_daemon_stop, takes
 * its daemon with it (one such daemon ran on for ten minutes beside later
 * benchmark runs). A child starts a daemon through the harness, hands it
 * over and is SIGKILLed; the daemon must be gone (or a zombie of init's)
 * within 5 s.
 */
static void test_harness_daemon_dies_with_its_test(void **state)
{
	struct kvt_daemon d;
	int p[2], i, st;
	pid_t child;
	char s = 0;

	(void)state;
	assert_int_equal(pipe(p), 0);
	child = fork();
	assert_true(child >= 0);
	if (!child) {
		close(p[0]);
		if (kvt_daemon_start(&d, NULL) ||
		    write(p[1], &d, sizeof(d)) != (ssize_t)sizeof(d))
			_exit(1);
		pause();
		_exit(0);
	}
	close(p[1]);
	assert_int_equal(read(p[0], &d, sizeof(d)), (ssize_t)sizeof(d));
	close(p[0]);
	assert_true(d.pid > 0);
	kill(child, SIGKILL);
	waitpid(child, &st, 0);
	for (i = 0; i < 500; i++) {
		s = kvt_proc_state(d.pid);
		if (s == 'X' || s == 'Z')
			break;
		usleep(10000);
	}
	if (s != 'X' && s != 'Z')
		kill(d.pid, SIGKILL);	/* not ours to reap: init's now */
	d.pid = 0;
	kvt_daemon_stop(&d);		/* its folder */
	if (s != 'X' && s != 'Z')
		fail_msg("the daemon outlived the test that started it (state %c)", s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sigterm_with_an_early_thread),
		cmocka_unit_test(test_sigint_with_an_early_thread),
		cmocka_unit_test(test_harness_daemon_dies_with_its_test),
	};

	return cmocka_run_group_tests_name("integration/signals", tests, NULL, NULL);
}
