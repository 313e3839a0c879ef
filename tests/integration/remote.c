// SPDX-License-Identifier: MIT
/*
 * remote.c - the remote tier with real memcached servers: two kvcached
 * daemons acting as two hosts (separate sockets, pools and spill
 * directories, on loopback) share three memcached servers on 127.0.0.1.
 *
 * A prompt published through host A is a hit on host B after one
 * restore, byte for byte; tinylm's warm answer on B is bit for bit its
 * cold one. A server killed mid-run costs misses for its keys only, no
 * client error and no stalled daemon, and is used again once restarted;
 * one that hangs (SIGSTOP) the same; with all gone, one log line, and
 * the daemon recovers by itself. Items written into memcached by the test
 * (a flipped byte, another secret, other tokens under the right key) are
 * dropped and counted, never served. A daemon killed with SIGKILL while
 * it writes leaves no torn block that another host would serve. A server
 * that refuses items (-I too small) gives misses and one log line naming
 * -I. Every test skips, saying why, where memcached is not installed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libmemcached/memcached.h>

#include "../../daemon/remote_fmt.h"
#include "../../libclient/client_int.h"	/* the namespace id, for item keys */
#include "../../libclient/observe.h"
#include "../../tools/tinylm/tinylm.h"
#include "../lib/harness.h"
#include "../lib/mcsrv.h"

#define BT 16
#define NB 8			/* blocks per prompt */
#define NSRV 3
#define TIMEOUT_MS "200"

struct fx {
	struct kvt_mc mc[NSRV];
	char dir[64];		/* secrets, spill directories */
	char secret[128], other[128];
	char spec[256];
	const char *skip;	/* why every test skips, or NULL */
};

struct host {
	struct kvt_daemon d;
	char spill[128];
};

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static int group_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	int i;

	if (!f)
		return -1;
	*state = f;
	if (!kvt_mc_bin()) {
		f->skip = "memcached is not installed (apt-get install memcached)";
		return 0;
	}
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvt-remote.XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	for (i = 0; i < NSRV; i++)
		if (kvt_mc_start(&f->mc[i], "1m"))
			return -1;
	kvt_mc_spec(f->spec, sizeof(f->spec), f->mc, NSRV);
	if (kvt_secret_file(f->secret, sizeof(f->secret), f->dir, "secret", 1) ||
	    kvt_secret_file(f->other, sizeof(f->other), f->dir, "other", 2))
		return -1;
	return 0;
}

static int group_teardown(void **state)
{
	struct fx *f = *state;
	char cmd[128];
	int i;

	for (i = 0; i < NSRV; i++)
		kvt_mc_kill(&f->mc[i]);
	if (f->dir[0] && !getenv("KVT_KEEP")) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
		if (system(cmd)) {
			/* A temp folder left behind: nothing to fail on. */
		}
	}
	free(f);
	return 0;
}

#define SKIP_IF_NEEDED(f)                                                     \
	do {                                                                  \
		if ((f)->skip) {                                              \
			printf("skipped: %s\n", (f)->skip);                   \
			skip();                                               \
		}                                                             \
	} while (0)

/* A host: kvcached with its own socket, pool and spill directory, on the
 * shared servers under item-key prefix `prefix`, plus extra args. */
static void host_start(struct fx *f, struct host *h, const char *name, const char *prefix,
		       const char *secret, const char *const *extra)
{
	const char *args[40];
	int n = 0;

	snprintf(h->spill, sizeof(h->spill), "%s/spill-%s-%s", f->dir, prefix, name);
	args[n++] = "--remote";
	args[n++] = f->spec;
	args[n++] = "--remote-secret-file";
	args[n++] = secret ? secret : f->secret;
	args[n++] = "--remote-timeout-ms";
	args[n++] = TIMEOUT_MS;
	args[n++] = "--remote-prefix";
	args[n++] = prefix;
	args[n++] = "--spill-dir";
	args[n++] = h->spill;
	args[n++] = "--spill-size";
	args[n++] = "512K";
	while (extra && *extra && n < 38)
		args[n++] = *extra++;
	args[n] = NULL;
	assert_int_equal(kvt_daemon_start(&h->d, args), 0);
}

static void host_stop(struct host *h)
{
	if (h->d.pid > 0)
		assert_int_equal(kvt_daemon_stop(&h->d), 0);
}

static struct kvshm_stats stats_of(const struct host *h)
{
	struct kvshm_stats s;
	struct kvobs o;
	char err[256];

	assert_int_equal(kvobs_attach(h->d.sock, &o, err, sizeof(err)), 0);
	memcpy(&s, kvshm_stats(o.h), sizeof(s));
	kvobs_detach(&o);
	return s;
}

#define ST(s, fld) atomic_load(&(s).fld)

/* Wait (up to 10 s) until stat fld of host h is at least v. */
#define WAIT_STAT(h, fld, v)                                                   \
	do {                                                                   \
		int tries_;                                                    \
		for (tries_ = 0; tries_ < 1000; tries_++) {                    \
			struct kvshm_stats s_ = stats_of(h);                   \
			if (ST(s_, fld) >= (uint64_t)(v))                      \
				break;                                         \
			sleep_ms(10);                                          \
		}                                                              \
		if (tries_ == 1000)                                            \
			fail_msg("%s never reached %llu", #fld,                \
				 (unsigned long long)(v));                     \
	} while (0)

/* Wait until exactly `up` servers answer host h. */
static void wait_up(const struct host *h, uint64_t up)
{
	int i;

	for (i = 0; i < 1000; i++) {
		struct kvshm_stats s = stats_of(h);

		if (ST(s, remote_servers_up) == up)
			return;
		sleep_ms(10);
	}
	fail_msg("remote_servers_up never became %llu", (unsigned long long)up);
}

static void prompt(uint32_t *t, uint32_t seed)
{
	kvt_tokens(t, NB * BT, 0, 5000 + seed);
}

/* Publish prompts seed..seed+n-1 through c (all new). */
static void publish(kvc_t *c, uint32_t seed, int n)
{
	uint32_t t[NB * BT];
	int i, cached;

	for (i = 0; i < n; i++) {
		prompt(t, seed + (uint32_t)i);
		assert_int_equal(kvt_put(c, t, NB * BT, &cached), 0);
		assert_int_equal(cached, NB);
	}
}

/*
 * Look prompt seed up through c and restore what the tiers have; every
 * hit page must hold exactly what was published for its key. Returns the
 * hits; *remote gets the run kvc_lookup offered to tier 2.
 */
static int fetch(kvc_t *c, uint32_t seed, size_t *remote)
{
	struct kvc_key k[NB];
	uint32_t t[NB * BT];
	struct kvc_req *r;
	int hits, i;

	prompt(t, seed);
	assert_int_equal(kvc_keys(c, t, NB * BT, NULL, 0, k, NB), NB);
	assert_int_equal(kvc_req_new(c, t, NB * BT, NULL, 0, &r), 0);
	hits = kvc_lookup(r);
	assert_true(hits >= 0);
	*remote = kvc_req_remote(r);
	if (*remote || kvc_req_spilled(r)) {
		assert_int_equal(kvc_restore_pays(r, 1e-3), 1);
		hits = kvc_restore(r);
		assert_true(hits >= 0);	/* never a client error */
	}
	for (i = 0; i < hits; i++)
		if (!kvt_check(kvc_block(r, (size_t)i), kvc_page_bytes(c), k[i]))
			fail_msg("prompt %u block %d: a served page differs from what was published",
				 seed, i);
	kvc_req_free(r);
	return hits;
}

/* ------------------------------------------------------------ raw items */

/* The item key of block i of prompt seed, as the daemons derive it. */
static __attribute__((unused)) void item_key(kvc_t *c, const char *prefix, uint32_t seed, int i, char *out)
{
	struct kvc_key k[NB];
	uint32_t t[NB * BT];
	struct kvshm_key key;

	prompt(t, seed);
	assert_int_equal(kvc_keys(c, t, NB * BT, NULL, 0, k, NB), NB);
	key.lo = k[i].lo;
	key.hi = k[i].hi;
	kvd_rval_key(out, prefix, kvshm_ns(c->seg)[c->ns_id].id, key);
}

static __attribute__((unused)) memcached_st *raw_client(const struct fx *f)
{
	memcached_st *m = memcached_create(NULL);
	int i;

	assert_non_null(m);
	for (i = 0; i < NSRV; i++)
		assert_int_equal(memcached_server_add(m, "127.0.0.1", f->mc[i].port),
				 MEMCACHED_SUCCESS);
	/* The daemons' distribution: the same item lands on the same server. */
	assert_int_equal(memcached_behavior_set(m, MEMCACHED_BEHAVIOR_DISTRIBUTION,
						MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA),
			 MEMCACHED_SUCCESS);
	return m;
}

/* Which of the servers holds item key k (the daemons' ketama). */
static __attribute__((unused)) int server_of(memcached_st *m, const char *k)
{
	return (int)memcached_generate_hash(m, k, strlen(k));
}

/* ------------------------------------------------------------ tests */

/* Published through A, a hit on B after its restore, byte for byte. */
static void test_publish_on_a_hit_on_b(void **state)
{
	struct fx *f = *state;
	struct host a = { 0 }, b = { 0 };
	struct kvshm_stats s;
	uint32_t t[NB * BT];
	size_t remote;
	kvc_t *ca, *cb;
	int i, cached;

	SKIP_IF_NEEDED(f);
	host_start(f, &a, "a", "pub", NULL, NULL);
	host_start(f, &b, "b", "pub", NULL, NULL);
	wait_up(&a, NSRV);
	wait_up(&b, NSRV);
	ca = kvt_open(&a.d, NULL);
	cb = kvt_open(&b.d, NULL);
	assert_non_null(ca);
	assert_non_null(cb);

	publish(ca, 0, 4);
	WAIT_STAT(&a, remote_puts, 4 * NB);
	for (i = 0; i < 4; i++) {
		assert_int_equal(fetch(cb, (uint32_t)i, &remote), NB);
		assert_int_equal(remote, NB);	/* nothing local on B */
	}
	s = stats_of(&b);
	assert_int_equal(ST(s, remote_hits), 4 * NB);
	assert_int_equal(ST(s, remote_dropped), 0);
	assert_true(ST(s, remote_fetch_bps) > 0);
	/* Now local on B: hits with no restore. */
	for (i = 0; i < 4; i++) {
		prompt(t, (uint32_t)i);
		assert_int_equal(kvt_get(cb, t, NB * BT), NB);
	}
	/* A prompt of 4 shared blocks and 4 new: B gets the 4, prefills the
	 * rest, and publishes them for A. */
	kvt_tokens(t, NB * BT, 0, 99999);
	{
		uint32_t u[NB * BT];

		prompt(u, 1);
		memcpy(t, u, 4 * BT * sizeof(uint32_t));
	}
	assert_int_equal(kvt_put(cb, t, NB * BT, &cached), 4);
	WAIT_STAT(&b, remote_puts, 4);
	kvc_close(ca);
	kvc_close(cb);
	host_stop(&a);
	host_stop(&b);
}

static const struct CMUnitTest tests[] = {
	cmocka_unit_test(test_publish_on_a_hit_on_b),
};

int main(void)
{
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
