// SPDX-License-Identifier: MIT
/*
 * kvbench.c - the benchmark as a smoke test: `kvbench --quick
 * --json` runs every built mode and prints one JSON object whose every row
 * has a kvcached figure and either a peer figure and ratio or the reason
 * its peer was skipped (gpu rows without a GPU: no figures, the reason); bad options exit 2 naming the problem; SIGINT in
 * the middle of a run leaves no server running and no folder behind.
 *
 * Against a daemon it did not start, kvbench leaves the user's blocks
 * alone and drops its own when done.
 *
 * Nothing here asserts a speed: the figures depend on the machine.
 * A peer server that is not installed is a printed note, not a failure
 * (its rows must then say "skipped: <server> not found").
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/mcsrv.h"
#include "../../libclient/observe.h"
#include "../../shm/stats.h"

/* Run kvbench with args (NULL-terminated) and TMPDIR=tmpdir (if not NULL);
 * stdout into *out (malloc'd, NUL-terminated). Returns the exit status. */
static int run_kvbench(const char *const *args, const char *tmpdir, char **out,
		       char **err)
{
	const char *argv[16];
	int po[2], pe[2], n = 0, st;
	size_t cap[2] = { 1 << 16, 1 << 16 }, len[2] = { 0, 0 };
	char *buf[2];
	pid_t pid;

	argv[n++] = kvt_bin("kvbench");
	while (*args && n < 15)
		argv[n++] = *args++;
	argv[n] = NULL;
	assert_int_equal(pipe(po), 0);
	assert_int_equal(pipe(pe), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		if (tmpdir)
			setenv("TMPDIR", tmpdir, 1);
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	buf[0] = malloc(cap[0]);
	buf[1] = malloc(cap[1]);
	assert_non_null(buf[0]);
	assert_non_null(buf[1]);
	/* stderr is small (notes); read stdout to the end, then stderr. */
	for (int i = 0; i < 2; i++) {
		int fd = i ? pe[0] : po[0];
		ssize_t r;

		for (;;) {
			if (len[i] + 1 >= cap[i]) {
				cap[i] *= 2;
				buf[i] = realloc(buf[i], cap[i]);
				assert_non_null(buf[i]);
			}
			r = read(fd, buf[i] + len[i], cap[i] - len[i] - 1);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
			len[i] += (size_t)r;
		}
		buf[i][len[i]] = 0;
		close(fd);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	*out = buf[0];
	if (err)
		*err = buf[1];
	else
		free(buf[1]);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool installed(const char *name)
{
	char path[512];
	const char *dirs[] = { "/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin",
			       "/usr/local/sbin" };

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dirs[i], name);
		if (!access(path, X_OK))
			return true;
	}
	return false;
}

/* The number after "name": in line; -1 and *is_null when null or absent. */
static double num_field(const char *line, const char *name, bool *is_null)
{
	char key[64];
	const char *p;

	snprintf(key, sizeof(key), "\"%s\":", name);
	p = strstr(line, key);
	*is_null = true;
	if (!p)
		return -1;
	p += strlen(key);
	if (!strncmp(p, "null", 4))
		return -1;
	*is_null = false;
	return strtod(p, NULL);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static void quick_json(void **state)
{
	const char *args[] = { "--quick", "--json", NULL };
	bool have_redis = installed("redis-server"), have_mc = installed("memcached");
	int rows = 0, by_mode[8] = { 0, 0, 0, 0, 0, 0, 0, 0 }, redis_rows = 0, mc_rows = 0, mac_rows = 0;
	int floor_rows = 0, floor_table_rows = 0;
	char *out, *err, *line, *save = NULL;
	int rc;

	(void)state;
#if defined(__SANITIZE_ADDRESS__)
	/* 40 s of a 2-CPU machine under ASan. The modes that use a given
	 * daemon run under ASan in external_daemon_left_clean; those that
	 * start their own (serve, remote, spill, tp) run under ASan only
	 * through the daemon paths of integration/remote, spill, tp and
	 * tinylm. */
	printf("SKIP: --quick --json runs in the plain build (the lookup, publish, pages, ttft and python modes run under ASan in external_daemon_left_clean)\n");
	skip();
#endif
	if (!have_redis)
		printf("note: redis-server not installed; its rows must say skipped\n");
	if (!have_mc)
		printf("note: memcached not installed; its rows must say skipped\n");
	rc = run_kvbench(args, NULL, &out, &err);
	if (rc != 0)
		printf("kvbench exited %d; stderr:\n%s\n", rc, err);
	assert_int_equal(rc, 0);
	assert_true(!strncmp(out, "{\"tool\":\"kvbench\",\"schema\":2,", 29));
	assert_non_null(strstr(out, "\"results\":["));
	assert_non_null(strstr(out, "\n]}\n"));
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		bool kv_null, peer_null, ratio_null;
		double kv, peer, ratio;

		if (strncmp(line, "{\"mode\":", 8) && strncmp(line, ",{\"mode\":", 9))
			continue;
		rows++;
		kv = num_field(line, "kvcached", &kv_null);
		peer = num_field(line, "peer", &peer_null);
		ratio = num_field(line, "ratio", &ratio_null);
		if (strstr(line, "\"mode\":\"remote\"") && strstr(line, "\"op\":\"mac-")) {
			/* The MAC candidates need no server: figures always. */
			mac_rows++;
		} else if (strstr(line, "\"mode\":\"remote\"")) {
			by_mode[7]++;
			/* Without memcached: no figures and the reason. */
			if (!have_mc) {
				assert_true(kv_null && peer_null && ratio_null);
				assert_non_null(strstr(line, "\"skipped\":\"memcached not found\""));
				continue;
			}
		}
		if (strstr(line, "\"mode\":\"gpu\"")) {
			by_mode[4]++;
			/* Without a CUDA build, driver or GPU: no figures and
			 * the reason; with one, figures as any row. */
			if (!strstr(line, "\"skipped\":null")) {
				assert_true(kv_null && peer_null && ratio_null);
				assert_null(strstr(line, "\"skipped\":\"\""));
				continue;
			}
		}
		if (strstr(line, "\"mode\":\"python\"")) {
			by_mode[5]++;
			/* The Python binding's rows: figures against C, except in
			 * a sanitizer build, whose library python3 cannot load. */
			if (!strstr(line, "\"skipped\":null")) {
				assert_true(kv_null && peer_null && ratio_null);
				/* numpy and torch forms, where they are missing */
				if (strstr(line, "\"skipped\":\"numpy or torch not installed\"")) {
					assert_non_null(strstr(line, "\"op\":\"py_request_"));
					continue;
				}
				assert_true(SANITIZED);
				assert_non_null(strstr(line, "\"skipped\":\"sanitizer build"));
				continue;
			}
			/* A difference of two noisy figures: any sign. */
			if (strstr(line, "\"op\":\"py_added\"")) {
				assert_false(kv_null);
				assert_true(peer == 2000 && !ratio_null);
				continue;
			}
		}
		assert_false(kv_null);
		assert_true(kv > 0);
		if (strstr(line, "\"peer_kind\":null")) {
			/* A zero-copy pin has no peer (none reads in place):
			 * no peer figure, no ratio, nothing skipped. */
			assert_non_null(strstr(line, "\"mode\":\"pages\",\"op\":\"pin\""));
			assert_true(peer_null && ratio_null);
			assert_non_null(strstr(line, "\"skipped\":null"));
			by_mode[2]++;
			continue;
		}
		assert_null(strstr(line, "\"op\":\"pin\""));	/* nor against a copy */
		if (strstr(line, "\"skipped\":null")) {
			assert_false(peer_null);
			assert_false(ratio_null);
			assert_true(peer > 0);
			assert_true(ratio > 0);
		} else {
			/* Only a server peer may be skipped, and only when absent. */
			assert_true(peer_null && ratio_null);
			if (strstr(line, "\"peer_kind\":\"redis-")) {
				assert_false(have_redis);
				assert_non_null(strstr(line, "\"skipped\":\"redis-server not found\""));
			} else {
				assert_non_null(strstr(line, "\"peer_kind\":\"memcached-"));
				assert_false(have_mc);
				assert_non_null(strstr(line, "\"skipped\":\"memcached not found\""));
			}
		}
		if (strstr(line, "\"mode\":\"lookup\""))
			by_mode[0]++;
		else if (strstr(line, "\"mode\":\"publish\""))
			by_mode[1]++;
		else if (strstr(line, "\"mode\":\"pages\""))
			by_mode[2]++;
		else if (strstr(line, "\"mode\":\"ttft\""))
			by_mode[3]++;
		else if (strstr(line, "\"mode\":\"serve\"")) {
			by_mode[6]++;
			assert_true(strstr(line, "\"workload\":\"qa\"") ||
				    strstr(line, "\"workload\":\"chat\"") ||
				    strstr(line, "\"workload\":\"scan\""));
			/* A cache never makes an engine compute more. */
			if (strstr(line, "\"op\":\"prefill_tokens\"") &&
			    strstr(line, "\"peer_kind\":\"none\""))
				assert_true(ratio <= 1.0);
		}
		/* The lookup against its floor (tools/bench/floor.h), and the
		 * floor against the table, for every size and process count. */
		floor_rows += strstr(line, "\"op\":\"lookup\"") &&
			      strstr(line, "\"peer_kind\":\"floor\"");
		floor_table_rows += strstr(line, "\"op\":\"lookup_floor\"") &&
				    strstr(line, "\"peer_kind\":\"hashtable\"");
		redis_rows += !!strstr(line, "\"peer_kind\":\"redis-");
		mc_rows += !!strstr(line, "\"peer_kind\":\"memcached-");
	}
	printf("kvbench --quick --json: %d rows (lookup %d, publish %d, pages %d, ttft %d, gpu %d, python %d, serve %d, remote %d; redis %d, memcached %d)\n",
	       rows, by_mode[0], by_mode[1], by_mode[2], by_mode[3], by_mode[4], by_mode[5],
	       by_mode[6], by_mode[7], redis_rows, mc_rows);
	assert_true(by_mode[0] > 0 && by_mode[1] > 0 && by_mode[2] > 0);
	assert_true(floor_rows > 0);
	assert_int_equal(floor_rows, floor_table_rows);
	/* Every floor request was the floor's case (a hit on one run of
	 * pages going up): none was handed to kvc_lookup. */
	assert_null(strstr(err, "lookup floor:"));
	/* ttft: warm and miss rows against the cold prefill; gpu: gather and
	 * scatter, measured or skipped. */
	assert_int_equal(by_mode[3], 2);
	assert_int_equal(by_mode[4], 2);
	/* remote: write, fetch and the cross-host TTFT; and the three MAC
	 * candidates against HMAC-SHA256. */
	assert_int_equal(by_mode[7], 3);
	assert_int_equal(mac_rows, 3);
	/* python: 1 and 256 blocks, each six token forms (array, list,
	 * numpy uint32 and int64, torch int32 and int64) and what the array
	 * form adds; or the two skipped rows of a sanitizer build. */
	assert_int_equal(by_mode[5], SANITIZED ? 2 : 14);
	/* serve (--quick: N = 2, qa, chat and scan): per workload, prefill
	 * tokens, TTFT p50 and p99, requests/s against none, private,
	 * private-tail, kvcached-lru, kvcached-clock and kvcached-nowait,
	 * and two hit ratios against all but none; scan adds the hot set's
	 * hit ratio. */
	assert_int_equal(by_mode[6], 3 * (4 * 6 + 2 * 5) + 5);
	assert_non_null(strstr(out, "\"serve\":{\"seed\":"));
	assert_true(redis_rows > 0 && mc_rows > 0);
	free(out);
	free(err);
}

/* The gpu mode alone, as a table: exit 0 whether or not there is a GPU;
 * rows skipped saying why, or figures in GB/s. */
static void gpu_mode(void **state)
{
	const char *args[] = { "--mode", "gpu", "--quick", NULL };
	char *out, *err;
	int rc;

	(void)state;
	rc = run_kvbench(args, NULL, &out, &err);
	if (rc != 0)
		printf("kvbench --mode gpu exited %d; stderr:\n%s\n", rc, err);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(out, "cuMemcpyDtoD"));
	if (strstr(out, "skipped: ")) {
		const char *sk = strstr(out, "skipped: ");

		printf("gpu mode: %.*s\n", (int)strcspn(sk, "\n"), sk);
	}
	else
		assert_non_null(strstr(out, "GB/s"));
	free(out);
	free(err);
}

static void bad_options(void **state)
{
	static const struct {
		const char *args[4];
		const char *msg;
	} cases[] = {
		{ { "--mode", "nosuch", NULL }, "--mode nosuch: unknown mode" },
		{ { "--seconds", "0", NULL }, "--seconds 0: must be" },
		{ { "--frobnicate", NULL }, "unknown option '--frobnicate'" },
		{ { "extra", NULL }, "unexpected argument 'extra'" },
		{ { "--serve-rounds", "0", NULL }, "--serve-rounds 0: must be" },
		{ { "--serve-procs", "2,99", NULL }, "--serve-procs 2,99: a list" },
		{ { "--serve-workloads", "qa,web", NULL }, "--serve-workloads qa,web: workloads are" },
	};
	char *out, *err;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = run_kvbench(cases[i].args, NULL, &out, &err);

		if (!strstr(err, cases[i].msg))
			printf("case %zu: stderr was: %s\n", i, err);
		assert_int_equal(rc, 2);
		assert_non_null(strstr(err, cases[i].msg));
		free(out);
		free(err);
	}
}

/* Does any live process's command line mention s? */
static bool process_mentions(const char *s)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	bool found = false;

	assert_non_null(d);
	while (!found && (e = readdir(d))) {
		char path[300], cmd[4096];
		ssize_t n;
		int fd;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
		fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		n = read(fd, cmd, sizeof(cmd) - 1);
		close(fd);
		if (n <= 0)
			continue;
		for (ssize_t i = 0; i < n; i++)
			if (!cmd[i])
				cmd[i] = ' ';
		cmd[n] = 0;
		found = strstr(cmd, s) != NULL;
	}
	closedir(d);
	return found;
}

/* Start kvbench with args (argv[0] first, NULL-terminated) in the
 * background, its output to /dev/null, TMPDIR set to tmpdir if given.
 * Returns its pid, or -1. */
static pid_t kvbench_quiet(const char *tmpdir, const char *const *args)
{
	pid_t pid = fork();

	if (!pid) {
		int fd = open("/dev/null", O_WRONLY);

		dup2(fd, 1);
		dup2(fd, 2);
		if (tmpdir)
			setenv("TMPDIR", tmpdir, 1);
		execv(kvt_bin("kvbench"), (char *const *)args);
		_exit(127);
	}
	return pid;
}

/* SIGINT while the servers run: they die, the private folder goes. */
static void sigint_cleans_up(void **state)
{
	char tmp[] = "/tmp/kvt-bench.XXXXXX", found[512] = "";
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	int st, i;
	struct dirent *e;
	pid_t pid;
	DIR *d;

	(void)state;
	assert_non_null(mkdtemp(tmp));
	pid = kvbench_quiet(tmp, (const char *const[]){ "kvbench", "--mode", "lookup",
							"--seconds", "5", NULL });
	assert_true(pid >= 0);
	/* Wait until a server or the daemon is up in kvbench's folder. */
	for (i = 0; i < 200 && !process_mentions(tmp); i++)
		nanosleep(&ts, NULL);
	nanosleep(&ts, NULL);
	kill(pid, SIGINT);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGINT);
	/* Servers are SIGKILLed: gone within a moment; the daemon SIGTERMed. */
	for (i = 0; i < 100 && process_mentions(tmp); i++)
		nanosleep(&ts, NULL);
	assert_false(process_mentions(tmp));
	d = opendir(tmp);
	assert_non_null(d);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			snprintf(found, sizeof(found), "%s", e->d_name);
	closedir(d);
	if (found[0])
		printf("left behind in %s: %s\n", tmp, found);
	assert_string_equal(found, "");
	assert_int_equal(rmdir(tmp), 0);
}

/* Pids of the live memcached processes whose parent is ppid (up to max). */
static int memcached_children(pid_t ppid, pid_t *out, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while (n < max && (e = readdir(d))) {
		char path[300], buf[512], comm[64], state;
		int pid, pp;
		FILE *f;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(buf, sizeof(buf), f) &&
		    sscanf(buf, "%d (%63[^)]) %c %d", &pid, comm, &state, &pp) == 4 &&
		    pp == ppid && state != 'Z' && !strcmp(comm, "memcached"))
			out[n++] = pid;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* pid still runs (not gone, not a zombie). */
static bool runs(pid_t pid)
{
	char state = kvt_proc_state(pid);

	return state != 'Z' && state != 'X';
}

/*
 * The remote mode's memcached servers die with kvbench (signal or error):
 * memcached drops to user nobody as root, which clears the death signal
 * its fork set, so only kvbench's own exit hooks can stop them.
 */
static void remote_servers_die_with_kvbench(void **state)
{
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	pid_t pid, mc[8];
	int st, i, n = 0, alive;

	(void)state;
	if (!kvt_mc_bin()) {
		printf("SKIP: memcached is not installed\n");
		skip();
	}
	pid = kvbench_quiet(NULL, (const char *const[]){ "kvbench", "--mode", "remote",
							 "--quick", NULL });
	assert_true(pid >= 0);
	/* Until its three servers run (or it ended on its own). */
	for (i = 0; i < 1200 && n < 3; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			fail_msg("kvbench --mode remote ended before its servers ran (status %d)", st);
		n = memcached_children(pid, mc, 8);
		if (n < 3)
			nanosleep(&ts, NULL);
	}
	assert_int_equal(n, 3);
	kill(pid, SIGTERM);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM);
	for (i = 0; i < 200; i++) {
		alive = 0;
		for (int k = 0; k < n; k++)
			alive += runs(mc[k]);
		if (!alive)
			break;
		nanosleep(&ts, NULL);
	}
	alive = 0;
	for (int k = 0; k < n; k++)
		if (runs(mc[k])) {
			printf("memcached %d outlived kvbench\n", (int)mc[k]);
			kill(mc[k], SIGKILL);	/* leave the machine clean, then fail */
			alive++;
		}
	assert_int_equal(alive, 0);
}

/*
 * Against a daemon it did not start (a user's, with the user's blocks in
 * it), kvbench works in namespaces of its own and drops their blocks when
 * it is done: the user's namespace keeps every page it holds pinned and
 * none of it is dropped, kvbench's have none left, and kvstat's namespace
 * rows say what was dropped.
 */
static bool ns_stats(const char *sock, const char *prefix, uint64_t *pages, uint64_t *dropped,
		     uint64_t *published)
{
	struct kvshm_snap s;
	struct kvobs o;
	char err[256];
	bool found = false;

	*pages = *dropped = *published = 0;
	assert_int_equal(kvobs_attach(sock, &o, err, sizeof(err)), 0);
	assert_int_equal(kvshm_snap_take(o.h, &s), 0);
	for (uint32_t i = 0; i < s.n_ns; i++) {
		if (!kvshm_snap_ns_used(&s, i) || strncmp(s.ns[i].model, prefix, strlen(prefix)))
			continue;
		found = true;
		*pages += s.ns_st[i].pages;
		*dropped += s.ns_st[i].dropped;
		*published += s.ns_st[i].published;
	}
	kvshm_snap_free(&s);
	kvobs_detach(&o);
	return found;
}

/* A ratio the table prints: "-", or at most two significant digits and
 * no exponent (850, 1700, 5.7, 0.10, 0.0029). */
static bool two_digits(const char *t)
{
	const char *num;
	char d[32];
	size_t n = 0;

	/* "-": no peer; "0": no ratio to give (a zero or missing figure). */
	if (!strcmp(t, "-") || !strcmp(t, "0"))
		return true;
	if (*t == '-')		/* a negative figure: py_added under noise */
		t++;
	num = t;
	if (!*t || strchr(t, 'e') || strlen(t) >= sizeof(d))
		return false;
	for (; *t; t++) {
		if (*t == '.')
			continue;
		if (*t < '0' || *t > '9')
			return false;
		if (n || *t != '0')
			d[n++] = *t;
	}
	if (!strchr(num, '.'))	/* an integer: its trailing zeros */
		while (n > 1 && d[n - 1] == '0')
			n--;
	return n >= 1 && n <= 2;
}

/* What the table check takes as a ratio: each figure kvbench prints (its
 * fmt_ratio), including the 0 of a missing figure and the negative
 * py_added of a loaded run, which once failed make test as "0". */
static void ratio_formats(void **state)
{
	static const char *const good[] = { "850", "1700", "5.7", "0.10", "0.0029", "1.0",
					    "0", "-0.14", "-", "-1700" };
	static const char *const bad[] = { "0.100", "2.64e-03", "1234", "5.75", "", "--1",
					   "0x10" };
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (!two_digits(good[i]))
			fail_msg("ratio '%s' refused", good[i]);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (two_digits(bad[i]))
			fail_msg("ratio '%s' taken", bad[i]);
}

/*
 * The table as a reader gets it (issue #38): the head first; columns in
 * line whatever the names' lengths; ratios of two significant digits; a
 * pin against no peer; under the table one legend line per op and per
 * peer it shows.
 */
static void check_table(const char *out)
{
	char peers[64][40], ops[64][40], line[1024];
	const char *p = out, *head;
	int npeer = 0, nop = 0, rows = 0, size_at, peer_at, end_at, i;

	assert_true(!strncmp(out, "kvbench: libkvclient ", 21));
	assert_non_null(strstr(out, "\ndaemon: "));
	head = strstr(out, "\nop ");
	assert_non_null(head);
	head++;
	snprintf(line, sizeof(line), "%.*s", (int)strcspn(head, "\n"), head);
	assert_non_null(strstr(line, "peer figure"));
	size_at = (int)(strstr(line, "  size") - line) + 2;
	peer_at = (int)(strstr(line, "  peer ") - line) + 2;
	end_at = (int)strlen(line);		/* "ratio", right-aligned */
	for (p = head + strlen(line) + 1; *p && *p != '\n'; p += strlen(line) + 1) {
		char op[40], peer[40], *last;
		int k;

		snprintf(line, sizeof(line), "%.*s", (int)strcspn(p, "\n"), p);
		if (strstr(line, "^ far from the goal, a ratio of ")) {
			assert_true(rows > 0 && line[0] == ' ');
			continue;
		}
		rows++;
		if (line[size_at - 1] != ' ' || line[size_at] == ' ' || line[peer_at - 1] != ' ' ||
		    line[peer_at] == ' ')
			fail_msg("a row out of the columns (size at %d, peer at %d):\n%s", size_at,
				 peer_at, line);
		assert_int_equal(sscanf(line, "%39s", op), 1);
		snprintf(peer, sizeof(peer), "%.*s", (int)strcspn(line + peer_at, " "),
			 line + peer_at);
		if (!strcmp(peer, "4k"))	/* flat's "4k cached, 16 blk" */
			snprintf(peer, sizeof(peer), "4k cached");
		if (!strcmp(op, "pin"))
			assert_string_equal(peer, "-");
		if (!strstr(line, "skipped: ")) {
			if ((int)strlen(line) != end_at)
				fail_msg("a row whose ratio is not under \"ratio\":\n%s", line);
			last = strrchr(line, ' ') + 1;
			if (!two_digits(last))
				fail_msg("ratio '%s' has more than two significant digits:\n%s", last,
					 line);
		}
		for (k = 0; k < nop && strcmp(ops[k], op); k++)
			;
		if (k == nop && nop < 64)
			snprintf(ops[nop++], sizeof(ops[0]), "%s", op);
		for (k = 0; strcmp(peer, "-") && k < npeer && strcmp(peers[k], peer); k++)
			;
		if (strcmp(peer, "-") && k == npeer && npeer < 64)
			snprintf(peers[npeer++], sizeof(peers[0]), "%s", peer);
	}
	assert_true(rows > 10);
	p = strstr(p, "\nops:\n");
	assert_non_null(p);
	for (i = 0; i < nop; i++) {
		snprintf(line, sizeof(line), "\n  %.39s ", ops[i]);
		if (!strstr(p, line))
			fail_msg("no legend line for op %s", ops[i]);
	}
	p = strstr(p, "\npeers (");
	assert_non_null(p);
	for (i = 0; i < npeer; i++) {
		snprintf(line, sizeof(line), "\n  %.39s", peers[i]);
		if (!strstr(p, line))
			fail_msg("no legend line for peer %s", peers[i]);
	}
}

static void external_daemon_left_clean(void **state)
{
	const char *dargs[] = { "--page-size", "64K", "--pool-size", "64M", NULL };
	/* Every mode --quick runs (issue #38: the python mode left its
	 * blocks behind). */
	const char *args[] = { "--quick", "--socket", NULL, NULL };
	uint64_t pages = 0, dropped, published;
	struct kvc_req *held;
	struct kvt_daemon d;
	char *out, *err;
	uint32_t t[160];
	kvc_t *c;
	int rc;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, dargs), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 160, 0, 7);
	assert_int_equal(kvt_put(c, t, 160, NULL), 0);	/* the user's 10 blocks */
	/* Held pinned while kvbench runs (its publishes would evict them:
	 * a shared cache); what must not happen is that kvbench drops them. */
	assert_int_equal(kvc_req_new(c, t, 160, NULL, 0, &held), 0);
	assert_int_equal(kvc_lookup(held), 10);
	args[2] = d.sock;
	rc = run_kvbench(args, NULL, &out, &err);
	if (rc)
		printf("kvbench exited %d; stderr:\n%s\n", rc, err);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(out, "pages dropped at the end"));
	check_table(out);
	/* The pages are counted by a sweep on the tick: wait for one. */
	for (int i = 0; i < 200; i++) {
		assert_true(ns_stats(d.sock, "kvt-tiny", &pages, &dropped, &published));
		if (pages == 10)
			break;
		usleep(10000);
	}
	assert_int_equal(pages, 10);
	assert_int_equal(dropped, 0);
	kvc_req_free(held);
	assert_int_equal(kvt_get(c, t, 160), 10);	/* still all there */
	/* No kvbench namespace holds a page (kvstat's view: the sweep's
	 * counts, so give it a few ticks). */
	for (int i = 0; i < 100; i++) {
		assert_true(ns_stats(d.sock, "kvbench-", &pages, &dropped, &published));
		if (!pages)
			break;
		usleep(20000);
	}
	if (pages)
		printf("kvbench left %llu pages in its namespaces; stderr:\n%s\n",
		       (unsigned long long)pages, err);
	assert_int_equal(pages, 0);
	assert_true(dropped > 0 && dropped <= published);
	kvc_close(c);
	free(out);
	free(err);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(ratio_formats),
		cmocka_unit_test(quick_json),
		cmocka_unit_test(external_daemon_left_clean),
		cmocka_unit_test(gpu_mode),
		cmocka_unit_test(bad_options),
		cmocka_unit_test(sigint_cleans_up),
		cmocka_unit_test(remote_servers_die_with_kvbench),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
