// SPDX-License-Identifier: MIT
/*
 * namespaces.c - what kvcached keeps per namespace (model), against the
 * real daemon and kvstat:
 *   - a model whose page fills at most half a pool page attaches with a
 *     warning in its errbuf and in the daemon's log, and kvstat shows its
 *     share of the page and the bytes it wastes; a fitting one gets none;
 *   - per-namespace statistics (lookups, hits, tokens, publishes, pages,
 *     clients) count each namespace's own traffic, also after its clients
 *     have left;
 *   - kvc_drop_namespace drops the caller's namespace's unpinned blocks and
 *     nobody else's; a second DROP in the same tick is -EAGAIN;
 *   - kvstat --reset zeroes the counters (daemon-wide, per namespace, top
 *     prefixes) and keeps the gauges; run as another user it is refused
 *     and changes nothing (needs root to become that user; else skipped).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../../libclient/observe.h"
#include "../../shm/stats.h"

#define V(s, f) ((s)->v[KVSHM_STAT_ID(f)])

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* A model of layers x 4 KiB pages (2 kv heads, head dim 32, 2 bytes). */
static struct kvc_model model(const char *name, uint32_t layers)
{
	struct kvc_model m = kvt_model();

	m.name = name;
	m.layers = layers;
	return m;
}

static kvc_t *open_model(const struct kvt_daemon *d, const struct kvc_model *m, char *err,
			 size_t errlen)
{
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock, .errbuf = err,
				 .errbuf_len = errlen };
	kvc_t *c = NULL;

	assert_int_equal(kvc_open(m, &o, &c), 0);
	return c;
}

/* Row of namespace `name` in a snapshot, or -1. */
static int ns_row(const struct kvshm_snap *s, const char *name)
{
	for (uint32_t i = 0; i < s->n_ns; i++)
		if (kvshm_snap_ns_used(s, i) && !strcmp(s->ns[i].model, name))
			return (int)i;
	return -1;
}

/* Wait (2 s at most) until the namespace's stats say `pred`, then leave
 * the snapshot in *s (taken again each try). */
static bool wait_ns(const struct kvt_daemon *d, struct kvshm_snap *s, const char *name,
		    bool (*pred)(const struct kvshm_snap *, int))
{
	struct kvobs o;
	char err[256];
	bool ok = false;

	assert_int_equal(kvobs_attach(d->sock, &o, err, sizeof(err)), 0);
	for (int i = 0; i < 200 && !ok; i++) {
		int r;

		if (i) {
			kvshm_snap_free(s);
			sleep_ms(10);
		}
		assert_int_equal(kvshm_snap_take(o.h, s), 0);
		r = ns_row(s, name);
		ok = r >= 0 && pred(s, r);
	}
	kvobs_detach(&o);
	return ok;
}

/* ------------------------------------------------- 1. page-size waste */

static bool has_4_pages(const struct kvshm_snap *s, int r)
{
	return s->ns_st[r].pages == 4;
}

static void test_waste_warning(void **state)
{
	const char *args[] = { "--page-size", "64K", "--pool-size", "4M", NULL };
	struct kvt_daemon d;
	struct kvc_model small = model("kvt-small", 1), fits = model("kvt-fits", 16),
			 half = model("kvt-half", 9);
	char err[512], out[16384];
	const char *kargs[] = { "--socket", d.sock, NULL };
	struct kvshm_snap s;
	uint32_t t[64];
	kvc_t *c;
	int r;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	/* 4 KiB of a 64 KiB page: attached, with the warning. */
	c = open_model(&d, &small, err, sizeof(err));
	assert_non_null(strstr(err, "model kvt-small fills 4 KiB of each 64 KiB pool page (6.2%)"));
	assert_non_null(strstr(err, "--page-size 4K fits it"));
	assert_true(kvt_log_has(&d, "model kvt-small fills 4 KiB of each 64 KiB pool page"));
	kvt_tokens(t, 64, 0, 1);
	assert_int_equal(kvt_put(c, t, 64, NULL), 0);
	kvc_close(c);
	/* 64 KiB: no warning, and one over half (36 KiB): none either. */
	c = open_model(&d, &fits, err, sizeof(err));
	assert_string_equal(err, "");
	kvc_close(c);
	c = open_model(&d, &half, err, sizeof(err));
	assert_string_equal(err, "");
	kvc_close(c);
	assert_false(kvt_log_has(&d, "model kvt-fits fills"));

	/* What kvstat shows: the share used and the bytes wasted. */
	assert_true(wait_ns(&d, &s, "kvt-small", has_4_pages));
	r = ns_row(&s, "kvt-small");
	assert_int_equal(s.ns[r].page_bytes, 4096);
	kvshm_snap_free(&s);
	kargs[1] = d.sock;
	assert_int_equal(kvt_run(kvt_bin("kvstat"), kargs, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "NAMESPACES (3)"));
	/* name, page, use, pages, wasted (4 x 60 KiB) */
	{
		char *line = strstr(out, "\nkvt-small "), name[32], page[16], use[16], wasted[16];
		unsigned pages;

		assert_non_null(line);
		assert_int_equal(sscanf(line + 1, "%31s %15[0-9.] KiB %15s %u %15[0-9.] KiB", name,
					page, use, &pages, wasted), 5);
		assert_string_equal(page, "4.0");
		assert_string_equal(use, "6.2%");
		assert_int_equal(pages, 4);
		assert_string_equal(wasted, "240.0");
	}
	assert_non_null(strstr(out, "! model kvt-small fills 4 KiB of each 64 KiB pool page"));
	assert_null(strstr(out, "! model kvt-fits"));
	{
		const char *jargs[] = { "--socket", d.sock, "--json", NULL };

		assert_int_equal(kvt_run(kvt_bin("kvstat"), jargs, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "\"name\":\"kvt-small\",\"model\":\"kvt-small\","
					    "\"page_bytes\":4096,\"page_use\":0.062500,\"pages\":4,"
					    "\"wasted_bytes\":245760,"));
	}
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* --------------------------------------- 2. statistics per namespace */

static bool a_counted(const struct kvshm_snap *s, int r)
{
	/* 3 lookups of 4 blocks: a miss, then two hits of all 4. */
	return s->ns_st[r].lookups == 3 && s->ns_st[r].hit_blocks == 8 &&
	       s->ns_st[r].miss_blocks == 4 && s->ns_st[r].published == 4 &&
	       s->ns_st[r].lookup_tokens == 3 * 70 && s->ns_st[r].hit_tokens == 2 * 64 &&
	       s->ns_st[r].pages == 4 && s->ns_st[r].clients == 0;
}

static bool b_counted(const struct kvshm_snap *s, int r)
{
	return s->ns_st[r].lookups == 1 && s->ns_st[r].hit_blocks == 0 &&
	       s->ns_st[r].miss_blocks == 2 && s->ns_st[r].published == 2 &&
	       s->ns_st[r].pages == 2 && s->ns_st[r].clients == 1;
}

static void test_stats_per_namespace(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model ma = model("kvt-ns-a", 1), mb = model("kvt-ns-b", 1);
	uint32_t t[70];
	struct kvshm_snap s;
	char err[256];
	kvc_t *a, *b;

	a = open_model(d, &ma, err, sizeof(err));
	b = open_model(d, &mb, err, sizeof(err));
	kvt_tokens(t, 70, 0, 11);
	assert_int_equal(kvt_put(a, t, 70, NULL), 0);
	assert_int_equal(kvt_get(a, t, 70), 4);
	kvc_close(a);
	/* A second client of the same model counts into the same row. */
	a = open_model(d, &ma, err, sizeof(err));
	assert_int_equal(kvt_get(a, t, 70), 4);
	kvc_close(a);
	/* Same tokens, other model: its own namespace, a miss. */
	assert_int_equal(kvt_put(b, t, 32, NULL), 0);
	assert_true(wait_ns(d, &s, "kvt-ns-a", a_counted));
	kvshm_snap_free(&s);
	assert_true(wait_ns(d, &s, "kvt-ns-b", b_counted));
	kvshm_snap_free(&s);
	kvc_close(b);
}

/* ---------------------------------------------------- 3. dropping */

static bool dropped_4(const struct kvshm_snap *s, int r)
{
	return s->ns_st[r].dropped == 4 && s->ns_st[r].pages == 1;
}

static void test_drop_namespace(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model ma = model("kvt-drop-a", 1), mb = model("kvt-drop-b", 1);
	uint32_t t[80];
	struct kvshm_snap s;
	struct kvc_req *pin;
	char err[256];
	kvc_t *a, *a2, *b;

	a = open_model(d, &ma, err, sizeof(err));
	a2 = open_model(d, &ma, err, sizeof(err));
	b = open_model(d, &mb, err, sizeof(err));
	kvt_tokens(t, 80, 0, 21);
	assert_int_equal(kvt_put(a, t, 80, NULL), 0);	/* 5 blocks */
	assert_int_equal(kvt_put(b, t, 80, NULL), 0);
	/* Another client of the namespace pins its first block. */
	assert_int_equal(kvc_req_new(a2, t, 16, NULL, 0, &pin), 0);
	assert_int_equal(kvc_lookup(pin), 1);

	assert_int_equal(kvc_drop_namespace(a), 4);
	assert_true(kvt_log_has(d, "dropped namespace"));
	assert_true(kvt_log_has(d, "(kvt-drop-a): 4 pages, 0 spill slots; 1 pinned or being written stay"));
	/* The pinned block stays; the rest of the chain is gone. */
	assert_int_equal(kvt_get(a, t, 80), 1);
	/* The other namespace keeps everything. */
	assert_int_equal(kvt_get(b, t, 80), 5);
	kvc_req_free(pin);
	assert_true(wait_ns(d, &s, "kvt-drop-a", dropped_4));
	kvshm_snap_free(&s);
	assert_int_equal(kvc_drop_namespace(NULL), -EINVAL);
	kvc_close(a);
	kvc_close(a2);
	kvc_close(b);
}

/* One DROP per tick: with a 10 s tick, the second (at once) is -EAGAIN
 * (and the handle lives on). */
static void test_drop_once_per_tick(void **state)
{
	const char *args[] = { "--tick-ms", "10000", NULL };
	struct kvt_daemon d;
	uint32_t t[32];
	kvc_t *c;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 32, 0, 31);
	assert_int_equal(kvt_put(c, t, 32, NULL), 0);
	assert_int_equal(kvc_drop_namespace(c), 2);
	assert_int_equal(kvc_drop_namespace(c), -EAGAIN);
	assert_int_equal(kvt_put(c, t, 32, NULL), 0);	/* all dropped: a miss */
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* ------------------------------------------------------ 4. resetting */

static bool ns_zeroed(const struct kvshm_snap *s, int r)
{
	return s->ns_st[r].lookups == 0 && s->ns_st[r].hit_blocks == 0 &&
	       s->ns_st[r].published == 0 && s->ns_st[r].pages == 3;
}

static bool ns_one_lookup(const struct kvshm_snap *s, int r)
{
	return s->ns_st[r].lookups == 1 && s->ns_st[r].hit_blocks == 3 &&
	       V(s, lookups) == 1 && V(s, hit_blocks) == 3;
}

/* Lookups and a hit counted, then reset by root (us): every counter is
 * zero, the gauges stay, and counting goes on from zero. */
static void test_reset(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model m = model("kvt-reset", 1);
	const char *args[] = { "--socket", d->sock, "--reset", NULL };
	char err[256], out[4096];
	struct kvshm_snap s;
	uint32_t t[48];
	kvc_t *c;

	c = open_model(d, &m, err, sizeof(err));
	kvt_tokens(t, 48, 0, 41);
	assert_int_equal(kvt_put(c, t, 48, NULL), 0);
	assert_int_equal(kvt_get(c, t, 48), 3);
	assert_int_equal(kvt_run(kvt_bin("kvstat"), args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "counters of kvcached reset"));
	assert_true(kvt_log_has(d, "statistics reset by pid"));
	assert_true(wait_ns(d, &s, "kvt-reset", ns_zeroed));
	assert_int_equal(V(&s, lookups), 0);
	assert_int_equal(V(&s, hit_tokens), 0);
	assert_int_equal(V(&s, publishes), 0);
	assert_int_equal(V(&s, allocs), 0);
	assert_int_equal(s.n_top, 0);
	assert_true(V(&s, reset_time_ns) > 0);
	/* Gauges stay: the pages are still cached. */
	assert_true(V(&s, pages_ready) >= 3);
	assert_int_equal(V(&s, clients_attached), 1);
	kvshm_snap_free(&s);
	/* A lookup after the reset counts from zero. */
	assert_int_equal(kvt_get(c, t, 48), 3);
	assert_true(wait_ns(d, &s, "kvt-reset", ns_one_lookup));
	kvshm_snap_free(&s);
	kvc_close(c);
	/* kvstat says since when it counts. */
	args[2] = NULL;
	assert_int_equal(kvt_run(kvt_bin("kvstat"), args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "counters reset "));
	assert_non_null(strstr(out, "AVG/S SINCE RESET"));
}

/* As another user (nobody, uid 65534), whom the daemon trusts to attach:
 * kvstat --reset is refused with the reason, and nothing is reset. */
static void test_reset_refused_to_others(void **state)
{
	const char *args[] = { "--allow-users", "0,65534", "--socket-mode", "0666", NULL };
	struct kvc_model m = model("kvt-reset-other", 1);
	struct kvt_daemon d;
	struct kvshm_snap s;
	struct kvobs o;
	char err[256], out[4096];
	uint32_t t[32];
	int pfd[2], st;
	ssize_t n;
	pid_t p;
	kvc_t *c;

	(void)state;
	if (geteuid() != 0) {
		print_message("skip: not root, cannot run kvstat as another user\n");
		skip();
	}
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = open_model(&d, &m, err, sizeof(err));
	kvt_tokens(t, 32, 0, 51);
	assert_int_equal(kvt_put(c, t, 32, NULL), 0);
	assert_int_equal(kvt_get(c, t, 32), 2);
	kvc_close(c);
	assert_int_equal(pipe(pfd), 0);
	p = fork();
	if (!p) {
		const char *argv[] = { kvt_bin("kvstat"), "--socket", d.sock, "--reset", NULL };

		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		close(pfd[0]);
		if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
			_exit(99);
		execv(argv[0], (char **)argv);
		_exit(98);
	}
	close(pfd[1]);
	n = read(pfd[0], out, sizeof(out) - 1);
	while (n > 0 && n < (ssize_t)sizeof(out) - 1) {
		ssize_t k = read(pfd[0], out + n, sizeof(out) - 1 - (size_t)n);

		if (k <= 0)
			break;
		n += k;
	}
	out[n > 0 ? n : 0] = 0;
	close(pfd[0]);
	assert_int_equal(waitpid(p, &st, 0), p);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1)
		fail_msg("kvstat --reset as uid 65534: status %d, output:\n%s", st, out);
	assert_non_null(strstr(out, "kvstat: --reset: kvcached refused: resetting the statistics is "
				    "allowed to root and to kvcached's own user (uid 0); uid 65534 is neither"));
	assert_true(kvt_log_has(&d, "uid 65534 is neither"));
	/* Nothing was reset. */
	assert_int_equal(kvobs_attach(d.sock, &o, err, sizeof(err)), 0);
	assert_int_equal(kvshm_snap_take(o.h, &s), 0);
	assert_int_equal(V(&s, lookups), 2);
	assert_int_equal(V(&s, reset_time_ns), 0);
	kvshm_snap_free(&s);
	kvobs_detach(&o);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_waste_warning),
		cmocka_unit_test(test_stats_per_namespace),
		cmocka_unit_test(test_drop_namespace),
		cmocka_unit_test(test_drop_once_per_tick),
		cmocka_unit_test(test_reset),
		cmocka_unit_test(test_reset_refused_to_others),
	};

	return cmocka_run_group_tests_name("integration/namespaces", tests, kvt_setup, kvt_teardown);
}
