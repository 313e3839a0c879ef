// SPDX-License-Identifier: MIT
/*
 * reload.c - SIGHUP on a running daemon (issue #35): each setting a
 * reload can change takes effect and kvstat shows it; one it cannot is
 * named as needing a restart and keeps its value; a file that does not
 * parse changes nothing; and a reload of high-watermark and eviction with
 * pages cached and clients attached loses nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
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

#define BT 16

struct fix {
	struct kvt_daemon d;
	char conf[96];
	char base[1024];	/* the lines every version of the file has */
};

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static uint64_t stat_of(const struct fix *f, size_t id)
{
	struct kvshm_snap s;
	struct kvobs o;
	char err[256];
	uint64_t v;

	assert_int_equal(kvobs_attach(f->d.sock, &o, err, sizeof(err)), 0);
	assert_int_equal(kvshm_snap_take(o.h, &s), 0);
	v = s.v[id];
	kvshm_snap_free(&s);
	kvobs_detach(&o);
	return v;
}

#define STAT(f, field) stat_of(f, KVSHM_STAT_ID(field))

/* The config file: the base lines, then `extra` (may be ""). */
static void write_conf(const struct fix *f, const char *extra)
{
	FILE *c = fopen(f->conf, "w");

	assert_non_null(c);
	fprintf(c, "%s%s", f->base, extra);
	fclose(c);
}

/* SIGHUP, and wait until the daemon has reloaded (or refused to). */
static void hup(struct fix *f)
{
	uint64_t before = STAT(f, reloads) + STAT(f, reload_errors);
	int i;

	assert_int_equal(kill(f->d.pid, SIGHUP), 0);
	for (i = 0; i < 500 && STAT(f, reloads) + STAT(f, reload_errors) == before; i++)
		sleep_ms(10);
	assert_int_equal(STAT(f, reloads) + STAT(f, reload_errors), before + 1);
}

/* A daemon whose settings come from a config file (flags would win over
 * it at every reload too): the small test pool, and `extra` lines. */
static int start(struct fix *f, const char *extra)
{
	const char *args[] = { "--config", f->conf, NULL };

	snprintf(f->conf, sizeof(f->conf), "/tmp/kvt-reload.XXXXXX");
	if (mkstemp(f->conf) < 0)
		return -1;
	snprintf(f->base, sizeof(f->base),
		 "page-size = 4K\npool-size = 1M\nhugepages = off\ntick-ms = 5\n"
		 "socket-mode = 0666\n");
	write_conf(f, extra);
	return kvt_daemon_start_bare(&f->d, args);
}

static void stop(struct fix *f)
{
	assert_int_equal(kvt_daemon_stop(&f->d), 0);
	unlink(f->conf);
}

static bool log_has(const struct fix *f, const char *s)
{
	return kvt_log_has(&f->d, s);
}

/* As uid 65534, gid 65533 (root only): does kvc_open attach? 0 it does,
 * 1 it is refused with -EACCES, else something else went wrong. */
static int attach_as_nobody(const struct fix *f)
{
	pid_t p = fork();

	if (!p) {
		struct kvc_model m = kvt_model();
		struct kvc_options op = { .size = sizeof(op), .socket_path = f->d.sock };
		kvc_t *c = NULL;
		int rc;

		if (setgid(65533) || setuid(65534))
			_exit(9);
		rc = kvc_open(&m, &op, &c);
		kvc_close(rc ? NULL : c);
		_exit(!rc ? 0 : rc == -EACCES ? 1 : 2);
	}
	return kvt_wait(p);
}

/* Each setting a reload applies, one at a time, as the log says and kvstat
 * shows; one a reload cannot apply; a file with an error. */
static void test_each_live_key(void **state)
{
	struct fix f;
	char line[512], me[32];
	struct kvt_mc mc = { 0 };
	bool have_mc = kvt_mc_bin() != NULL;
	struct kvshm_snap s;
	struct kvobs o;
	char err[256];
	uint32_t i;
	bool found = false;

	(void)state;
	assert_int_equal(start(&f, ""), 0);
	assert_int_equal(STAT(&f, cfg_high_watermark), 10);
	assert_int_equal(STAT(&f, cfg_eviction), 1);	/* s3fifo */

	write_conf(&f, "low-watermark = 7\n");
	hup(&f);
	assert_int_equal(STAT(&f, cfg_low_watermark), 7);
	assert_true(log_has(&f, "reload: low-watermark 5 -> 7"));

	write_conf(&f, "low-watermark = 7\nhigh-watermark = 25\n");
	hup(&f);
	assert_int_equal(STAT(&f, cfg_high_watermark), 25);
	assert_true(log_has(&f, "reload: high-watermark 10 -> 25"));

	strcat(f.base, "low-watermark = 7\nhigh-watermark = 25\n");
	write_conf(&f, "eviction = clock\n");
	hup(&f);
	assert_int_equal(STAT(&f, cfg_eviction), 2);
	assert_true(log_has(&f, "reload: eviction s3fifo -> clock"));

	write_conf(&f, "eviction = clock\nmax-share = 40\n");
	hup(&f);
	assert_int_equal(STAT(&f, cfg_max_share), 40);

	strcat(f.base, "eviction = clock\nmax-share = 40\n");
	write_conf(&f, "tenant-share = 60\nnamespace-share = 70\n");
	hup(&f);
	assert_int_equal(STAT(&f, cfg_tenant_share), 60);
	assert_int_equal(STAT(&f, cfg_namespace_share), 70);

	strcat(f.base, "tenant-share = 60\nnamespace-share = 70\n");
	write_conf(&f, "tenant = t1 salt=one share=30 no-insert\n");
	hup(&f);
	assert_true(log_has(&f, "reload: tenant 0 tenants -> 1 tenants"));
	assert_int_equal(kvobs_attach(f.d.sock, &o, err, sizeof(err)), 0);
	assert_int_equal(kvshm_snap_take(o.h, &s), 0);
	for (i = 0; i < s.n_tenants; i++)
		if (kvshm_snap_tenant_used(&s, i) && !strcmp(s.tenants[i].name, "t1")) {
			found = true;
			assert_int_equal(s.tenants[i].share, 30);
			assert_true(s.tenants[i].flags & KVSHM_TENANT_NO_INSERT);
		}
	assert_true(found);
	kvshm_snap_free(&s);
	kvobs_detach(&o);
	{	/* ...and it is in force: that tenant's client never publishes. */
		struct kvc_model m = kvt_model();
		struct kvc_options op = { .size = sizeof(op), .socket_path = f.d.sock,
					  .salt = "one", .salt_len = 3 };
		uint32_t t[BT];
		kvc_t *c = NULL;

		assert_int_equal(kvc_open(&m, &op, &c), 0);
		kvt_tokens(t, BT, 0, 3);
		assert_int_equal(kvt_put(c, t, BT, NULL), -EROFS);
		kvc_close(c);
	}

	strcat(f.base, "tenant = t1 salt=one share=30 no-insert\n");
	write_conf(&f, "log-level = debug\n");
	hup(&f);
	assert_int_equal(STAT(&f, cfg_log_level), 7);
	assert_true(log_has(&f, "reload: log-level info -> debug"));
	assert_true(log_has(&f, "debug: client"));	/* our observer, logged now */

	/* allow-users: a user the daemon refused attaches after the reload. */
	snprintf(me, sizeof(me), "%u", (unsigned)geteuid());
	strcat(f.base, "log-level = debug\n");
	snprintf(line, sizeof(line), "allow-users = 0,%s,65534\nallow-groups = 65534\n", me);
	if (geteuid() == 0)
		assert_int_equal(attach_as_nobody(&f), 1);
	write_conf(&f, line);
	hup(&f);
	assert_true(log_has(&f, "reload: allow-users 2 entries -> 3 entries") ||
		    log_has(&f, "reload: allow-users 1 entries -> 3 entries"));
	assert_true(log_has(&f, "reload: allow-groups 0 entries -> 1 entries"));
	if (geteuid() == 0) {
		assert_int_equal(attach_as_nobody(&f), 0);
	} else {
		print_message("skip part: not root, cannot attach as another user\n");
	}
	strcat(f.base, line);

	/* The remote tier: opened, its settings changed, closed again. */
	if (have_mc && !kvt_mc_start(&mc, "1m")) {
		char spec[128];

		kvt_mc_spec(spec, sizeof(spec), &mc, 1);
		snprintf(line, sizeof(line), "remote = %s\nremote-insecure = true\n", spec);
		write_conf(&f, line);
		hup(&f);
		assert_int_equal(STAT(&f, remote_servers), 1);
		for (i = 0; i < 300 && STAT(&f, remote_servers_up) != 1; i++)
			sleep_ms(10);
		assert_int_equal(STAT(&f, remote_servers_up), 1);
		snprintf(line, sizeof(line),
			 "remote = %s\nremote-insecure = true\nremote-timeout-ms = 250\n"
			 "remote-write = evict\nremote-prefix = other\n", spec);
		write_conf(&f, line);
		hup(&f);
		assert_true(log_has(&f, "reload: remote-timeout-ms 100 -> 250"));
		assert_true(log_has(&f, "reload: remote-write publish -> evict"));
		assert_int_equal(STAT(&f, remote_write_mode), 2);
		write_conf(&f, "");
		hup(&f);
		assert_true(log_has(&f, "reload: no remote tier now"));
		assert_int_equal(STAT(&f, remote_servers), 0);
		kvt_mc_kill(&mc);
	} else {
		print_message("skip part: no memcached to give the remote tier\n");
	}

	/* A setting a reload cannot change: named, and it stays. */
	write_conf(&f, "block-tokens = 32\n");
	hup(&f);
	assert_true(log_has(&f, "reload: block-tokens 16 -> 32 needs a restart; 16 stays in force"));
	assert_true(log_has(&f, "0 settings applied, 1 need a restart"));
	{
		struct kvobs ob;

		assert_int_equal(kvobs_attach(f.d.sock, &ob, err, sizeof(err)), 0);
		assert_int_equal(ob.h->geo.block_tokens, 16);
		kvobs_detach(&ob);
	}
	/* A file with an error changes nothing. */
	write_conf(&f, "high-watermark = 50\nmax-share = 400\n");
	hup(&f);
	assert_int_equal(STAT(&f, reload_errors), 1);
	assert_int_equal(STAT(&f, cfg_high_watermark), 25);
	assert_true(log_has(&f, "max-share 400: must be a percentage"));
	assert_true(log_has(&f, "reload: the settings have errors (above): nothing changed"));
	{	/* kvstat shows what is in force */
		const char *ka[] = { "--socket", f.d.sock, NULL };
		char out[16384];

		assert_int_equal(kvt_run(kvt_bin("kvstat"), ka, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "settings watermarks 7%..25%, eviction clock, shares: "
					    "process 40%, tenant 60%, namespace 70%; log debug"));
	}
	stop(&f);
}

/*
 * The case: SIGHUP changes high-watermark and eviction on a daemon
 * with pages cached and a client attached that holds pins. Nothing is
 * lost: every cached prompt still hits, the pinned pages keep their bytes
 * and survive the floods that follow under the new policy, the client
 * goes on publishing, and kvstat shows the new values.
 */
static void test_sighup_keeps_cache(void **state)
{
	struct fix f;
	uint32_t t[20][4 * BT], u[4 * BT];
	struct kvc_req *held;
	uint64_t entries, ready;
	int i, cached = 0;
	kvc_t *c;

	(void)state;
	assert_int_equal(start(&f, "high-watermark = 10\neviction = s3fifo\n"), 0);
	c = kvt_open(&f.d, NULL);
	assert_non_null(c);
	for (i = 0; i < 20; i++) {
		kvt_tokens(t[i], 4 * BT, 0, 100 + (uint32_t)i);
		assert_int_equal(kvt_put(c, t[i], 4 * BT, &cached), 0);
		assert_int_equal(cached, 4);
	}
	/* A request of the client holds prompt 0's pages pinned. */
	assert_int_equal(kvc_req_new(c, t[0], 4 * BT, NULL, 0, &held), 0);
	assert_int_equal(kvc_lookup(held), 4);
	entries = STAT(&f, index_entries);
	ready = STAT(&f, pages_ready);
	assert_int_equal(ready, 80);

	write_conf(&f, "high-watermark = 30\neviction = lru\n");
	hup(&f);
	assert_true(log_has(&f, "reload: high-watermark 10 -> 30"));
	assert_true(log_has(&f, "reload: eviction s3fifo -> lru"));
	assert_true(log_has(&f, "reload: 2 settings applied, 0 need a restart"));
	assert_int_equal(STAT(&f, index_entries), entries);
	assert_int_equal(STAT(&f, pages_ready), ready);
	assert_int_equal(STAT(&f, clients_attached), 1);
	for (i = 0; i < 20; i++)
		assert_int_equal(kvt_get(c, t[i], 4 * BT), 4);	/* bytes checked too */
	{
		const char *ka[] = { "--socket", f.d.sock, NULL };
		const char *kj[] = { "--socket", f.d.sock, "--json", NULL };
		char out[16384];

		assert_int_equal(kvt_run(kvt_bin("kvstat"), ka, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "settings watermarks 5%..30%, eviction lru"));
		assert_non_null(strstr(out, "1 reloads (0 refused)"));
		assert_int_equal(kvt_run(kvt_bin("kvstat"), kj, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "\"settings\":{\"low_watermark\":5,\"high_watermark\":30,"
					    "\"eviction\":\"lru\""));
	}
	/* The client goes on; floods evict under the new policy, never the
	 * pinned pages. */
	kvt_tokens(u, 4 * BT, 0, 999);
	assert_int_equal(kvt_put(c, u, 4 * BT, &cached), 0);
	assert_int_equal(cached, 4);
	for (i = 0; i < 3; i++)
		assert_int_equal(kvt_flood(&f.d, 40, 7000 + 100 * (uint32_t)i), 0);
	assert_true(STAT(&f, evictions) > 0);
	{
		struct kvc_key k[4];

		assert_int_equal(kvc_req_keys(held, k, 4), 4);
		for (i = 0; i < 4; i++)
			assert_true(kvt_check(kvc_block(held, (size_t)i), kvc_page_bytes(c), k[i]));
	}
	kvc_req_free(held);
	assert_int_equal(kvt_get(c, t[0], 4 * BT), 4);	/* pinned through the floods */
	kvc_close(c);
	stop(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_each_live_key),
		cmocka_unit_test(test_sighup_keeps_cache),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
