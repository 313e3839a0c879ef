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

#include "../../fmt/remote_item.h"
#include "../../libclient/client_int.h"	/* the namespace id, for item keys */
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

/* Daemons a failed test left running: stopped by the group teardown. */
static pid_t running[16];

static void running_add(pid_t p)
{
	for (int i = 0; i < 16; i++)
		if (!running[i]) {
			running[i] = p;
			return;
		}
}

static void running_del(pid_t p)
{
	for (int i = 0; i < 16; i++)
		if (running[i] == p)
			running[i] = 0;
}

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

	for (i = 0; i < 16; i++)
		if (running[i] > 0) {
			kill(running[i], SIGKILL);
			waitpid(running[i], NULL, 0);
		}
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
	running_add(h->d.pid);
}

static void host_stop(struct host *h)
{
	if (h->d.pid > 0) {
		running_del(h->d.pid);
		assert_int_equal(kvt_daemon_stop(&h->d), 0);
	}
}

static struct kvshm_stats stats_of(const struct host *h)
{
	struct kvshm_stats s;

	kvt_stats(h->d.sock, &s);
	return s;
}

#define ST(s, fld) atomic_load(&(s).fld)
/* Stat fld of host h now. */
#define STN(h, fld) ({ struct kvshm_stats s__ = stats_of(h); ST(s__, fld); })

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

/* Hosts A and B on the shared servers under prefix, both seeing every
 * server, each with a client of the test model. */
static void pair_start(struct fx *f, struct host *a, struct host *b, const char *prefix,
		       kvc_t **ca, kvc_t **cb)
{
	host_start(f, a, "a", prefix, NULL, NULL);
	host_start(f, b, "b", prefix, NULL, NULL);
	wait_up(a, NSRV);
	wait_up(b, NSRV);
	*ca = kvt_open(&a->d, NULL);
	*cb = kvt_open(&b->d, NULL);
	assert_non_null(*ca);
	assert_non_null(*cb);
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
static void item_key(kvc_t *c, const char *prefix, uint32_t seed, int i, char *out)
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

static memcached_st *raw_client(const struct fx *f)
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
static int server_of(memcached_st *m, const char *k)
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
	pair_start(f, &a, &b, "pub", &ca, &cb);

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
	/* kvstat and /metrics show the tier. */
	{
		const char *js[] = { "--socket", b.d.sock, "--json", NULL };
		const char *pr[] = { "--socket", b.d.sock, "--prometheus", NULL };
		const char *tx[] = { "--socket", b.d.sock, NULL };
		static char out[1 << 16];

		assert_int_equal(kvt_run(kvt_bin("kvstat"), js, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "\"remote\":{\"enabled\":true,\"servers\":3,"
					    "\"servers_up\":3,\"write\":\"publish\",\"puts\":4,"));
		assert_non_null(strstr(out, "\"hits\":32,\"misses\":0,\"dropped\":0"));
		assert_int_equal(kvt_run(kvt_bin("kvstat"), pr, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "kvcached_remote_fetch_blocks_total{result=\"hit\"} 32\n"));
		assert_non_null(strstr(out, "kvcached_remote_servers{state=\"up\"} 3\n"));
		assert_int_equal(kvt_run(kvt_bin("kvstat"), tx, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "remote tier: 3 of 3 memcached servers up, blocks written on publish"));
	}
	kvc_close(ca);
	kvc_close(cb);
	host_stop(&a);
	host_stop(&b);
}


/*
 * SGLang's namespace (engine keys) after a restart: its pages went to the
 * servers when published; the restarted host (an empty pool) finds them
 * there through the engine's keys, each block checked against the
 * namespace root as its parent (engine-keyed blocks are not chained),
 * byte for byte, wherever a key sits in the asked batch.
 */
static void test_engine_keys_after_restart(void **state)
{
	struct fx *f = *state;
	struct host a = { 0 };
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o) };
	static const char keys[] = "k0k1k2k3k4k5k6k7";
	static const char back[] = "k5k2k7";
	uint32_t lens[NB] = { 2, 2, 2, 2, 2, 2, 2, 2 };
	struct kvc_key k[NB];
	struct kvc_req *r;
	kvc_t *c;
	int i;

	SKIP_IF_NEEDED(f);
	m.flags = KVC_MODEL_ENGINE_KEYS;
	host_start(f, &a, "a", "eng", NULL, NULL);
	wait_up(&a, NSRV);
	o.socket_path = a.d.sock;
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(kvc_req_new_keys(c, keys, lens, NB, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), NB);
	assert_int_equal(kvc_req_keys(r, k, NB), NB);
	for (i = 0; i < NB; i++)
		kvt_fill(kvc_block(r, (size_t)i), kvc_page_bytes(c), k[i]);
	assert_int_equal(kvc_publish(r), NB);
	kvc_req_free(r);
	WAIT_STAT(&a, remote_puts, NB);
	kvc_close(c);
	host_stop(&a);

	host_start(f, &a, "a", "eng", NULL, NULL);
	wait_up(&a, NSRV);
	o.socket_path = a.d.sock;
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	/* Three of them, out of order. */
	assert_int_equal(kvc_req_new_keys(c, back, lens, 3, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_req_remote(r), 3);
	assert_int_equal(kvc_restore(r), 3);
	for (i = 0; i < 3; i++)
		if (!kvt_check(kvc_block(r, (size_t)i), kvc_page_bytes(c), k[back[2 * i + 1] - '0']))
			fail_msg("block %d: a served page differs from what was published", i);
	kvc_req_free(r);
	assert_int_equal(STN(&a, remote_hits), 3);
	assert_int_equal(STN(&a, remote_dropped), 0);
	/* Now in the pool: all eight, the three a plain hit. */
	assert_int_equal(kvc_req_new_keys(c, keys, lens, NB, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);	/* k0 is not in the pool yet */
	assert_int_equal(kvc_restore(r), NB);
	kvc_req_free(r);
	kvc_close(c);
	host_stop(&a);
}

/* How many times s appears in host h's log. */
static int log_count(const struct host *h, const char *s)
{
	char buf[1 << 16];
	size_t n, len = strlen(s);
	int count = 0;
	FILE *fp = fopen(h->d.log, "r");
	char *p;

	assert_non_null(fp);
	n = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	buf[n] = 0;
	for (p = buf; (p = strstr(p, s)); p += len)
		count++;
	return count;
}

static void read_file(const char *path, uint8_t *buf, size_t *len)
{
	FILE *fp = fopen(path, "r");

	assert_non_null(fp);
	*len = fread(buf, 1, 4096, fp);
	fclose(fp);
}

/* Replace the item of block i of prompt seed in memcached with what
 * damage() makes of it (given the cluster secret and the other one). */
static void rewrite(const struct fx *f, kvc_t *c, const char *prefix, uint32_t seed, int i,
		    void (*damage)(const struct fx *f, uint8_t *val, size_t len))
{
	memcached_st *m = raw_client(f);
	char k[KVD_RVAL_KEY_MAX];
	memcached_return_t rc;
	uint32_t flags;
	size_t len;
	char *val;

	item_key(c, prefix, seed, i, k);
	val = memcached_get(m, k, strlen(k), &len, &flags, &rc);
	assert_non_null(val);
	damage(f, (uint8_t *)val, len);
	assert_int_equal(memcached_set(m, k, strlen(k), val, len, 0, 0), MEMCACHED_SUCCESS);
	free(val);
	memcached_free(m);
}

/* Seal an item again under the secret in file `path`. */
static void reseal(const char *path, uint8_t *val, size_t len)
{
	struct kvd_rmac *mac;
	uint8_t secret[4096];
	size_t slen;

	read_file(path, secret, &slen);
	assert_int_equal(kvd_rmac_new(&mac, secret, slen), 0);
	assert_int_equal(kvd_rval_seal(mac, val, len), 0);
	kvd_rmac_free(mac);
}

static void flip_payload(const struct fx *f, uint8_t *val, size_t len)
{
	(void)f;
	val[len - KVD_RVAL_MAC - 100] ^= 0x5a;	/* a payload byte */
}

static void other_secret(const struct fx *f, uint8_t *val, size_t len)
{
	reseal(f->other, val, len);	/* a host with another secret */
}

static void other_tokens(const struct fx *f, uint8_t *val, size_t len)
{
	/* The right key and parent, other tokens, sealed with the right
	 * secret: a collision, or a host that lies with the secret. */
	val[sizeof(struct kvd_rval_hdr) + 4] ^= 1;
	reseal(f->secret, val, len);
}

/* A flipped byte, another host's secret, other tokens: each dropped and
 * counted on B, the prefix ending there, never served. */
static void test_bad_items_dropped(void **state)
{
	struct fx *f = *state;
	struct host a = { 0 }, b = { 0 };
	struct kvshm_stats s;
	size_t remote;
	kvc_t *ca, *cb;

	SKIP_IF_NEEDED(f);
	pair_start(f, &a, &b, "bad", &ca, &cb);
	publish(ca, 100, 3);
	WAIT_STAT(&a, remote_puts, 3 * NB);

	rewrite(f, ca, "bad", 100, 3, flip_payload);
	rewrite(f, ca, "bad", 101, 2, other_secret);
	rewrite(f, ca, "bad", 102, 5, other_tokens);
	assert_int_equal(fetch(cb, 100, &remote), 3);
	s = stats_of(&b);
	assert_int_equal(ST(s, remote_dropped), 1);
	assert_int_equal(fetch(cb, 101, &remote), 2);
	s = stats_of(&b);
	assert_int_equal(ST(s, remote_dropped), 2);
	assert_int_equal(fetch(cb, 102, &remote), 5);
	s = stats_of(&b);
	assert_int_equal(ST(s, remote_dropped), 3);
	/* One warning an interval (RELIABILITY: logs that flood): the first
	 * drop is logged, the two after it within the interval counted. */
	assert_int_equal(log_count(&b, "MAC does not check"), 1);
	assert_int_equal(log_count(&b, "dropped:"), 1);
	/* Blocks after a dropped one were fetched and placed (they are
	 * genuine) but the prefix ends at the gap: asked again, the same. */
	assert_int_equal(fetch(cb, 100, &remote), 3);
	kvc_close(ca);
	kvc_close(cb);
	host_stop(&a);
	host_stop(&b);
}

/* An item as a host of the previous release wrote it: format version 1
 * (HMAC-SHA256, a 32-byte MAC: 16 bytes longer). */
static void old_version(const struct fx *f, uint8_t *val, size_t len)
{
	struct kvd_rval_hdr h;

	(void)f;
	(void)len;
	memcpy(&h, val, sizeof(h));
	h.version = 1;
	memcpy(val, &h, sizeof(h));
}

/* During an upgrade of the fleet, B fetches items of another format
 * version: each is a miss, counted as stale (not as dropped, and not
 * logged as damage), and the prefix ends there. */
static void test_other_version_is_a_miss(void **state)
{
	struct fx *f = *state;
	struct host a = { 0 }, b = { 0 };
	struct kvshm_stats s;
	size_t remote;
	kvc_t *ca, *cb;

	SKIP_IF_NEEDED(f);
	pair_start(f, &a, &b, "stale", &ca, &cb);
	publish(ca, 200, 1);
	WAIT_STAT(&a, remote_puts, NB);
	rewrite(f, ca, "stale", 200, 3, old_version);
	assert_int_equal(fetch(cb, 200, &remote), 3);
	s = stats_of(&b);
	assert_int_equal(ST(s, remote_stale), 1);
	assert_int_equal(ST(s, remote_dropped), 0);
	assert_true(ST(s, remote_misses) >= 1);
	assert_int_equal(log_count(&b, "dropped"), 0);
	{
		const char *js[] = { "--socket", b.d.sock, "--json", NULL };
		static char out[1 << 16];

		assert_int_equal(kvt_run(kvt_bin("kvstat"), js, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "\"dropped\":0,\"stale\":1,"));
	}
	kvc_close(ca);
	kvc_close(cb);
	host_stop(&a);
	host_stop(&b);
}

/*
 * A host with the wrong secret fetches a prompt of the fleet's: every
 * block is dropped (NB in one fetch), but its log says so once, then,
 * after the interval, how many more there were; not one line per block.
 */
static void test_wrong_secret_logs_once(void **state)
{
	struct fx *f = *state;
	struct host a = { 0 }, b = { 0 };
	struct kvshm_stats s;
	size_t remote;
	kvc_t *ca, *cb;
	char more[64];
	int tries, dropped;

	SKIP_IF_NEEDED(f);
	host_start(f, &a, "a", "wrong", NULL, NULL);
	host_start(f, &b, "b", "wrong", f->other, NULL);
	wait_up(&a, NSRV);
	wait_up(&b, NSRV);
	ca = kvt_open(&a.d, NULL);
	cb = kvt_open(&b.d, NULL);
	assert_non_null(ca);
	assert_non_null(cb);
	publish(ca, 400, 1);
	/* Puts are best effort (a loaded machine can see a server time out
	 * and its puts skipped): what counts is that several were stored. */
	for (tries = 0; tries < 1000; tries++) {
		s = stats_of(&a);
		if (ST(s, remote_puts) >= NB)
			break;
		sleep_ms(10);
	}
	assert_int_equal(fetch(cb, 400, &remote), 0);	/* one FETCH of NB */
	s = stats_of(&b);
	dropped = (int)ST(s, remote_dropped);
	assert_true(dropped >= 2);
	assert_int_equal(log_count(&b, "dropped:"), 1);
	snprintf(more, sizeof(more), "%d more like it", dropped - 1);
	for (tries = 0; tries < 600 && !log_count(&b, more); tries++)
		usleep(50000);	/* the interval is 5 s */
	assert_int_equal(log_count(&b, more), 1);
	assert_int_equal(log_count(&b, "dropped:"), 1);
	kvc_close(ca);
	kvc_close(cb);
	host_stop(&a);
	host_stop(&b);
}

/* The first block of prompt seed whose item lives on server v (NB: none). */
static int first_on(const struct fx *f, kvc_t *c, const char *prefix, uint32_t seed, int v)
{
	memcached_st *m = raw_client(f);
	char k[KVD_RVAL_KEY_MAX];
	int i;

	for (i = 0; i < NB; i++) {
		item_key(c, prefix, seed, i, k);
		if (server_of(m, k) == v)
			break;
	}
	memcached_free(m);
	return i;
}

static bool alive(const struct host *h)
{
	return h->d.pid > 0 && kill(h->d.pid, 0) == 0 && kvproto_can_connect(h->d.sock);
}

/*
 * One server killed mid-run: B's fetches return (never an error) with
 * misses for that server's blocks only; both daemons keep serving. Then
 * it is started again (empty, same port): both daemons use it again.
 * `hang` instead stops it with SIGSTOP (a server that takes the
 * connection and never answers) and continues it.
 */
static void server_fault(struct fx *f, const char *prefix, bool hang)
{
	struct host a = { 0 }, b = { 0 };
	struct kvshm_stats s;
	size_t remote;
	kvc_t *ca, *cb;
	int v = 1, p, some_on_v = 0;
	uint64_t puts;

	pair_start(f, &a, &b, prefix, &ca, &cb);
	publish(ca, 200, 6);
	WAIT_STAT(&a, remote_puts, 6 * NB);

	if (hang)
		kvt_mc_stop(&f->mc[v]);
	else
		kvt_mc_kill(&f->mc[v]);
	for (p = 200; p < 206; p++) {
		int want = first_on(f, ca, prefix, (uint32_t)p, v);

		some_on_v += want < NB;
		/* The call returns, with the daemon alive, and the prefix ends
		 * exactly at the first block that lived on the lost server. */
		assert_int_equal(fetch(cb, (uint32_t)p, &remote), want);
		assert_true(alive(&b));
	}
	assert_true(some_on_v > 0);
	wait_up(&b, NSRV - 1);
	s = stats_of(&b);
	assert_int_equal(ST(s, remote_dropped), 0);
	if (hang)
		assert_true(ST(s, remote_timeouts) > 0);
	/* A keeps serving its own tiers, and publishing (its puts to the lost
	 * server are skipped). */
	publish(ca, 300, 2);
	assert_true(alive(&a));

	if (hang)
		kvt_mc_cont(&f->mc[v]);
	else
		assert_int_equal(kvt_mc_restart(&f->mc[v]), 0);
	wait_up(&a, NSRV);
	wait_up(&b, NSRV);
	puts = STN(&a, remote_puts);
	publish(ca, 400, 4);
	WAIT_STAT(&a, remote_puts, puts + 4 * NB);
	for (p = 400, some_on_v = 0; p < 404; p++) {
		some_on_v += first_on(f, ca, prefix, (uint32_t)p, v) < NB;
		assert_int_equal(fetch(cb, (uint32_t)p, &remote), NB);
	}
	assert_true(some_on_v > 0);	/* the server is used again */
	kvc_close(ca);
	kvc_close(cb);
	host_stop(&a);
	host_stop(&b);
}

static void test_server_killed_and_back(void **state)
{
	struct fx *f = *state;

	SKIP_IF_NEEDED(f);
	server_fault(f, "kill", false);
}

static void test_server_hangs_and_back(void **state)
{
	struct fx *f = *state;

	SKIP_IF_NEEDED(f);
	server_fault(f, "hang", true);
}

/* Every server gone: one log line, lookups stop offering tier 2, the
 * daemon serves its own tiers; then they come back and it recovers by
 * itself. */
static void test_all_servers_gone(void **state)
{
	struct fx *f = *state;
	struct host a = { 0 };
	uint32_t t[NB * BT];
	struct kvc_req *r;
	uint64_t puts;
	kvc_t *ca;
	int i;

	SKIP_IF_NEEDED(f);
	host_start(f, &a, "a", "gone", NULL, NULL);
	wait_up(&a, NSRV);
	ca = kvt_open(&a.d, NULL);
	assert_non_null(ca);
	for (i = 0; i < NSRV; i++)
		kvt_mc_kill(&f->mc[i]);
	wait_up(&a, 0);
	publish(ca, 500, 2);
	prompt(t, 501);
	assert_int_equal(kvt_get(ca, t, NB * BT), NB);	/* its own tier 0 */
	prompt(t, 599);
	assert_int_equal(kvc_req_new(ca, t, NB * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_req_remote(r), 0);	/* no tier 2 offered */
	kvc_req_free(r);
	sleep_ms(1500);	/* a probe or two more: still one line */
	assert_int_equal(log_count(&a, "none of the 3 memcached servers answers"), 1);
	for (i = 0; i < NSRV; i++)
		assert_int_equal(kvt_mc_restart(&f->mc[i]), 0);
	wait_up(&a, NSRV);
	puts = STN(&a, remote_puts);
	publish(ca, 510, 1);
	WAIT_STAT(&a, remote_puts, puts + NB);
	kvc_close(ca);
	host_stop(&a);
}

/* A big-page model, so that an item takes many TCP segments. */
static struct kvc_model big_model(void)
{
	struct kvc_model m = kvt_model();

	m.layers = 32;	/* 128 KiB pages */
	m.name = "kvt-big";
	return m;
}

static kvc_t *open_big(const struct host *h)
{
	struct kvc_model m = big_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = h->d.sock };
	kvc_t *c = NULL;

	return kvc_open(&m, &o, &c) ? NULL : c;
}

static int writer(void *arg)
{
	const struct host *a = arg;
	kvc_t *c = open_big(a);
	uint32_t t[NB * BT];
	int i;

	if (!c)
		return 2;
	for (i = 0; i < 48; i++) {
		prompt(t, 600 + (uint32_t)i);
		if (kvt_put(c, t, NB * BT, NULL) < 0)
			return 0;	/* the daemon died under us: expected */
	}
	return 0;
}

/* kill -9 of host A's daemon while its workers write 128 KiB items: B
 * serves only whole blocks (every served page checks), and finds nothing
 * torn to drop. */
static void test_kill9_while_writing(void **state)
{
	static const char *const big[] = { "--page-size", "128K", "--pool-size", "16M", NULL };
	struct fx *f = *state;
	struct host a = { 0 }, b = { 0 };
	struct kvshm_stats s;
	uint32_t t[NB * BT];
	struct kvc_key k[NB];
	kvc_t *cb;
	pid_t w;
	int p, i, hits, got = 0;

	SKIP_IF_NEEDED(f);
	host_start(f, &a, "a", "k9", NULL, big);
	host_start(f, &b, "b", "k9", NULL, big);
	wait_up(&a, NSRV);
	wait_up(&b, NSRV);
	w = kvt_fork(writer, &a);
	WAIT_STAT(&a, remote_puts, 16);
	kill(a.d.pid, SIGKILL);
	waitpid(a.d.pid, NULL, 0);
	running_del(a.d.pid);
	a.d.pid = 0;
	kvt_daemon_stop(&a.d);	/* only removes its folder */
	assert_int_equal(kvt_wait(w), 0);

	cb = open_big(&b);
	assert_non_null(cb);
	for (p = 600; p < 648; p++) {
		struct kvc_req *r;

		prompt(t, (uint32_t)p);
		assert_int_equal(kvc_keys(cb, t, NB * BT, NULL, 0, k, NB), NB);
		assert_int_equal(kvc_req_new(cb, t, NB * BT, NULL, 0, &r), 0);
		assert_true(kvc_lookup(r) >= 0);
		hits = kvc_req_remote(r) ? kvc_restore(r) : 0;
		assert_true(hits >= 0);
		for (i = 0; i < hits; i++)
			assert_true(kvt_check(kvc_block(r, (size_t)i), kvc_page_bytes(cb), k[i]));
		got += hits;
		kvc_req_free(r);
	}
	assert_true(got >= 16);	/* what A had written before it died */
	s = stats_of(&b);
	assert_int_equal(ST(s, remote_dropped), 0);
	kvc_close(cb);
	host_stop(&b);
}

/* A server whose item size limit (-I) is below an item: puts fail with
 * one log line naming -I, the client sees nothing of it. Also: without
 * a secret file, --remote-insecure runs, with a warning. */
static void test_item_too_large(void **state)
{
	struct fx *f = *state;
	struct kvt_mc small = { 0 };
	const char *args[] = { "--remote", NULL, "--remote-insecure", "--remote-timeout-ms",
			       TIMEOUT_MS, NULL };
	struct kvt_daemon d;
	char spec[64];
	uint32_t t[NB * BT];
	int cached;
	kvc_t *c;

	SKIP_IF_NEEDED(f);
	assert_int_equal(kvt_mc_start(&small, "2k"), 0);
	kvt_mc_spec(spec, sizeof(spec), &small, 1);
	args[1] = spec;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	assert_true(kvt_log_has(&d, "remote-insecure"));
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	{
		struct host h = { .d = d };

		wait_up(&h, 1);
		prompt(t, 700);
		assert_int_equal(kvt_put(c, t, NB * BT, &cached), 0);
		WAIT_STAT(&h, remote_put_errors, NB);
		assert_int_equal(log_count(&h, "start memcached with -I above"), 1);
		assert_int_equal(STN(&h, remote_puts), 0);
	}
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
	kvt_mc_kill(&small);
}

/* The secret file: one others can read, or a short one, and none at all
 * without --remote-insecure: the daemon refuses to start, saying why. */
static void test_secret_checks(void **state)
{
	struct fx *f = *state;
	char path[160], out[2048], sock[160];
	const char *args[] = { "--socket", sock, "--pool-size", "1M", "--page-size", "4K",
			       "--remote", f->spec, "--remote-secret-file", path, NULL };
	int fd;

	SKIP_IF_NEEDED(f);
	snprintf(sock, sizeof(sock), "%s/refused.sock", f->dir);
	assert_int_equal(kvt_secret_file(path, sizeof(path), f->dir, "open-secret", 3), 0);
	assert_int_equal(chmod(path, 0644), 0);
	assert_int_not_equal(kvt_run(NULL, args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "lets other users at it"));

	snprintf(path, sizeof(path), "%s/short-secret", f->dir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "12345678", 8), 8);
	close(fd);
	assert_int_not_equal(kvt_run(NULL, args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "a secret has 16 to 4096"));

	args[8] = NULL;	/* no secret file, no --remote-insecure */
	assert_int_not_equal(kvt_run(NULL, args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "needs remote-secret-file"));
}

/* ------------------------------------------------------------ tinylm */

static struct tlm_model model;

static kvc_t *open_tiny(const char *sock)
{
	struct kvc_model km = tlm_kvc_model(&model, BT);
	struct kvc_options o = { .size = sizeof(o), .socket_path = sock };
	kvc_t *c = NULL;

	return kvc_open(&km, &o, &c) ? NULL : c;
}

/* Prefill (through c, or cold) and 8 greedy tokens. */
static struct tlm_run run_prompt(kvc_t *c, const uint32_t *t, size_t n, float *logits,
				 uint32_t *gen)
{
	struct tlm_state st;
	struct tlm_run run;
	uint32_t tok;
	int i;

	assert_int_equal(tlm_state_init(&st, &model, n + 8), 0);
	assert_int_equal(tlm_prefill(&st, c, t, n, NULL, 0, "doc", 0, &run), 0);
	memcpy(logits, st.logits, model.cfg.vocab_size * sizeof(float));
	for (i = 0; i < 8; i++) {
		gen[i] = tok = tlm_argmax(st.logits, model.cfg.vocab_size);
		assert_int_equal(tlm_forward(&st, &tok, NULL, NULL, 1, 1), 0);
	}
	tlm_state_free(&st);
	return run;
}

/* A document prefilled on host A; asked on host B, tinylm fetches its
 * blocks from the remote tier, and its answer is bit for bit a cold
 * prefill's on B. */
static void test_tinylm_across_hosts(void **state)
{
	static const char *const pages[] = { "--page-size", "8K", "--pool-size", "2M", NULL };
	struct tlm_config cfg = { .dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4,
				  .n_kv_heads = 2, .seq_len = 1024 };
	struct fx *f = *state;
	struct host a = { 0 }, b = { 0 };
	size_t n = 20 * BT + 5, i;
	uint32_t *t = malloc(n * sizeof(uint32_t)), ga[8], gb[8], gc[8];
	float *la, *lb, *lc;
	struct tlm_run ra, rb;
	char err[256];
	kvc_t *ca, *cb;
	uint64_t s = 77;

	SKIP_IF_NEEDED(f);
	assert_int_equal(tlm_model_generate(&model, &cfg, 7, err, sizeof(err)), 0);
	la = malloc(model.cfg.vocab_size * sizeof(float));
	lb = malloc(model.cfg.vocab_size * sizeof(float));
	lc = malloc(model.cfg.vocab_size * sizeof(float));
	assert_true(t && la && lb && lc);
	for (i = 0; i < n; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		t[i] = TLM_BYTE0 + (uint32_t)((s >> 24) % 256);
	}
	host_start(f, &a, "a", "tlm", NULL, pages);
	host_start(f, &b, "b", "tlm", NULL, pages);
	wait_up(&a, NSRV);
	wait_up(&b, NSRV);
	ca = open_tiny(a.d.sock);
	cb = open_tiny(b.d.sock);
	assert_non_null(ca);
	assert_non_null(cb);

	ra = run_prompt(ca, t, n, la, ga);
	assert_int_equal(ra.published, 20);
	assert_int_equal(ra.missed, 20);
	assert_int_equal(ra.short_err, 0);
	assert_int_equal(ra.remote_tokens, 0);
	WAIT_STAT(&a, remote_puts, 20);
	run_prompt(NULL, t, n, lc, gc);		/* cold, on B's side */
	rb = run_prompt(cb, t, n, lb, gb);	/* warm on B: from tier 2 */
	assert_int_equal(rb.cache_err, 0);
	assert_int_equal(rb.hit_tokens, 20 * BT);
	assert_int_equal(rb.remote_tokens, 20 * BT);	/* all of them: kvdemo says so */
	assert_int_equal(rb.spill_tokens, 0);
	assert_int_equal(rb.computed, 5);
	assert_memory_equal(lb, lc, model.cfg.vocab_size * sizeof(float));
	assert_memory_equal(gb, gc, sizeof(gc));
	assert_memory_equal(la, lc, model.cfg.vocab_size * sizeof(float));
	assert_int_equal(STN(&b, remote_hits), 20);
	kvc_close(ca);
	kvc_close(cb);
	host_stop(&a);
	host_stop(&b);
	tlm_model_free(&model);
	free(t);
	free(la);
	free(lb);
	free(lc);
}

/* kvdemo shows which hits came from the remote tier (issue #24): a prompt
 * published through host A, asked again on host B. */
static void test_kvdemo_says_remote_hits(void **state)
{
	static const char *const pages[] = { "--page-size", "4K", "--pool-size", "2M", NULL };
	static const char want[] = "): 201 tokens, 192 hit tokens (95.5%, 192 from the remote tier)";
	struct fx *f = *state;
	struct host a = { 0 }, b = { 0 };
	char text[256], out[32768];
	const char *args[] = { "--socket", NULL, "--layers", "1", "--dim", "32", "--hidden", "64",
			       "--heads", "2", "--kv-heads", "1", "--max-tokens", "1",
			       "--prompt", text, NULL };
	const char *line;
	int rc;

	SKIP_IF_NEEDED(f);
	for (int i = 0; i < 200; i++)
		text[i] = "the remote tier holds this prompt "[i % 34];
	text[200] = 0;	/* BOS + 200 bytes: 12 full blocks */
	host_start(f, &a, "a", "demo", NULL, pages);
	host_start(f, &b, "b", "demo", NULL, pages);
	wait_up(&a, NSRV);
	wait_up(&b, NSRV);
	args[1] = a.d.sock;
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo on A: status %d\n%s", rc, out);
	assert_null(strstr(out, "from the remote tier"));
	WAIT_STAT(&a, remote_puts, 12);
	args[1] = b.d.sock;
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo on B: status %d\n%s", rc, out);
	line = strstr(out, "  prompt 1 (");
	assert_non_null(line);
	if (strncmp(strstr(line, "): "), want, strlen(want)))
		fail_msg("kvdemo on B did not say its hits came from the remote tier:\n%s", out);
	host_stop(&a);
	host_stop(&b);
}

static const struct CMUnitTest tests[] = {
	cmocka_unit_test(test_publish_on_a_hit_on_b),
	cmocka_unit_test(test_tinylm_across_hosts),
	cmocka_unit_test(test_kvdemo_says_remote_hits),
	cmocka_unit_test(test_engine_keys_after_restart),
	cmocka_unit_test(test_bad_items_dropped),
	cmocka_unit_test(test_wrong_secret_logs_once),
	cmocka_unit_test(test_other_version_is_a_miss),
	cmocka_unit_test(test_server_killed_and_back),
	cmocka_unit_test(test_server_hangs_and_back),
	cmocka_unit_test(test_kill9_while_writing),
	cmocka_unit_test(test_item_too_large),
	cmocka_unit_test(test_secret_checks),
	/* Last: it kills and restarts every server. */
	cmocka_unit_test(test_all_servers_gone),
};

int main(void)
{
	/* KVT_ONLY=test_name runs one (checking a test against a reverted fix). */
	if (getenv("KVT_ONLY"))
		cmocka_set_test_filter(getenv("KVT_ONLY"));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
