// SPDX-License-Identifier: MIT
/*
 * flight.c - single-flight prefill against the real daemon, with real
 * processes: three processes given the same new prompt at once compute it
 * once between them (the others wait for its pages) and each gets the
 * cold logits bit for bit; a writer SIGKILLed while others wait leaves
 * them a miss, and they compute the prompt themselves (one of them, the
 * other waiting for that one); a writer that gives
 * its pages back unpublished does the same; a waiter whose short timeout
 * runs out goes on by itself and publishes; a published block wakes its
 * waiters with hits that hold the writer's bytes.
 *
 * No timing is asserted: where one process must be waiting before another
 * acts, the test waits for the lookup to be counted (ordering), and every
 * wait carries a generous timeout so that a bug fails the test instead of
 * hanging it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/obswait.h"
#include "../lib/tlm_fixture.h"
#include "../../shm/key.h"
#include "../../shm/proto.h"
#include "../../shm/stats.h"
#include "../../libclient/observe.h"
#include "../../tools/tinylm/tinylm.h"

#define BT 16
#define NBLK 20
#define NTOK (NBLK * BT + 5)	/* 20 full blocks and a partial one */
#define LONG_MS 60000		/* a bug fails the test, never hangs it */

static struct tlm_model model;

static const char *const daemon_args[] = { "--page-size", "8K", "--pool-size", "2M", NULL };

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static kvc_t *open_tiny(const struct kvt_daemon *d)
{
	return kvt_tlm_open(&model, d->sock);
}

#define prompt kvt_tlm_prompt

/* The daemon's stats, through an observer mapping kept for the test. */
static struct kvobs obs;
#define STAT(f) KVT_STAT(&obs, f)

/* Poll (the daemon folds ledgers every 5 ms tick) until cond, or fail. */
#define UNTIL(cond) KVT_UNTIL(cond, LONG_MS)

/* ---- a prefill in a child process, reporting back through a pipe ---- */

struct result {
	struct tlm_run run;
	float logits[512];
};

struct child {
	pid_t pid;
	int res;		/* read end: struct result */
};

/*
 * Fork a process that attaches, says so on `ready` (if >= 0), waits for a
 * byte on `go` (if >= 0), runs tlm_prefill of the prompt and writes its
 * struct result. It exits 0, or non-zero if anything failed.
 */
static struct child prefill_child(const struct kvt_daemon *d, uint32_t seed, int ready, int go)
{
	struct child ch;
	int fds[2];

	assert_int_equal(pipe(fds), 0);
	ch.pid = fork();
	assert_true(ch.pid >= 0);
	if (!ch.pid) {
		static struct result res;
		uint32_t t[NTOK];
		struct tlm_state s;
		kvc_t *c = open_tiny(d);
		char b;

		close(fds[0]);
		if (!c || tlm_state_init(&s, &model, NTOK))
			_exit(3);
		prompt(t, NTOK, seed);
		if ((ready >= 0 && write(ready, "r", 1) != 1) || (go >= 0 && read(go, &b, 1) != 1))
			_exit(4);
		if (tlm_prefill(&s, c, t, NTOK, NULL, 0, "flight", 0, &res.run))
			_exit(5);
		memcpy(res.logits, s.logits, model.cfg.vocab_size * sizeof(float));
		if (write(fds[1], &res, sizeof(res)) != sizeof(res))
			_exit(6);
		tlm_state_free(&s);
		kvc_close(c);
		_exit(0);
	}
	close(fds[1]);
	ch.res = fds[0];
	return ch;
}

static void child_result(struct child *ch, struct result *res)
{
	size_t got = 0;

	while (got < sizeof(*res)) {
		ssize_t n = read(ch->res, (char *)res + got, sizeof(*res) - got);

		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(ch->res);
	assert_int_equal(kvt_wait(ch->pid), 0);
	assert_int_equal(got, sizeof(*res));
}

/* The cold reference: the prompt with no cache at all. */
static void cold_logits(uint32_t seed, float *out)
{
	uint32_t t[NTOK];
	struct tlm_state s;
	struct tlm_run r;

	prompt(t, NTOK, seed);
	assert_int_equal(tlm_state_init(&s, &model, NTOK), 0);
	assert_int_equal(tlm_prefill(&s, NULL, t, NTOK, NULL, 0, NULL, 0, &r), 0);
	memcpy(out, s.logits, model.cfg.vocab_size * sizeof(float));
	tlm_state_free(&s);
}

/*
 * A writer that claims the prompt and never publishes: it attaches, looks
 * up, is granted (and so announces) every block, says so on the pipe it
 * returns, and sleeps until killed.
 */
static pid_t stuck_writer_ex(const struct kvt_daemon *d, const struct kvc_model *km,
			     uint32_t seed, size_t ntok, bool get_dropped)
{
	int fds[2];
	pid_t p;
	char b;

	assert_int_equal(pipe(fds), 0);
	p = fork();
	assert_true(p >= 0);
	if (!p) {
		struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
		uint32_t *t = malloc(ntok * sizeof(uint32_t));
		struct kvc_req *r;
		kvc_t *c;

		close(fds[0]);
		if (!t || kvc_open(km, &o, &c))
			_exit(3);
		prompt(t, ntok, seed);
		if (kvc_req_new(c, t, ntok, NULL, 0, &r) || kvc_lookup(r) != 0 ||
		    kvc_alloc(r) != (int)(ntok / BT))
			_exit(4);
		if (get_dropped) {
			/* Break the protocol on our connection (the one socket
			 * this process has): the daemon drops it while we live
			 * on holding the granted pages. */
			uint32_t junk[8] = { 0xdeadbeef };
			struct stat st;
			int fd;

			for (fd = 3; fd < 256; fd++)
				if (!fstat(fd, &st) && S_ISSOCK(st.st_mode) &&
				    write(fd, junk, sizeof(junk)) != sizeof(junk))
					_exit(6);
		}
		if (write(fds[1], "a", 1) != 1)
			_exit(5);
		for (;;)
			pause();
	}
	close(fds[1]);
	assert_int_equal(read(fds[0], &b, 1), 1);
	close(fds[0]);
	return p;
}

static pid_t stuck_writer(const struct kvt_daemon *d, const struct kvc_model *km,
			  uint32_t seed, size_t ntok)
{
	return stuck_writer_ex(d, km, seed, ntok, false);
}

/* Three processes, one new prompt, released at once: computed once. */
static void test_three_at_once_prefill_once(void **state)
{
	struct kvt_daemon *d = *state;
	static float cold[512];
	struct result res[3];
	struct child ch[3];
	int ready[2], go[2], i;
	size_t computed = 0, published = 0;
	char b;

	cold_logits(101, cold);
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	for (i = 0; i < 3; i++)
		ch[i] = prefill_child(d, 101, ready[1], go[0]);
	for (i = 0; i < 3; i++)
		assert_int_equal(read(ready[0], &b, 1), 1);
	assert_int_equal(write(go[1], "ggg", 3), 3);
	for (i = 0; i < 3; i++) {
		child_result(&ch[i], &res[i]);
		assert_int_equal(res[i].run.cache_err, 0);
		assert_memory_equal(res[i].logits, cold, model.cfg.vocab_size * sizeof(float));
		computed += res[i].run.computed;
		published += res[i].run.published;
		printf("process %d: computed %zu, hit %zu (%zu by waiting), published %zu\n", i,
		       res[i].run.computed, res[i].run.hit_tokens, res[i].run.wait_tokens,
		       res[i].run.published);
	}
	/* One prompt's worth, plus the partial block each other one runs. */
	assert_true(computed <= NTOK + 2 * BT);
	assert_int_equal(published, NBLK);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

/* A writer dies while two others wait: they get a miss and compute. */
static void test_writer_killed_waiters_compute(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model km = tlm_kvc_model(&model, BT);
	static float cold[512];
	struct result res[2];
	struct child ch[2];
	uint64_t lookups, lost, served, timeouts;
	size_t computed = 0;
	pid_t w;
	int i;

	cold_logits(202, cold);
	/* Earlier tests' clients gone: every lookup so far is counted. */
	UNTIL(STAT(clients_attached) == 0);
	lookups = STAT(lookups);
	lost = STAT(wait_lost);
	served = STAT(wait_served);
	timeouts = STAT(wait_timeouts);
	w = stuck_writer(d, &km, 202, NTOK);
	UNTIL(STAT(pages_in_flight) == NBLK && STAT(lookups) == lookups + 1);
	for (i = 0; i < 2; i++)
		ch[i] = prefill_child(d, 202, -1, -1);
	/* Both have looked up, and so seen the blocks in flight: kill. */
	UNTIL(STAT(lookups) == lookups + 3);
	assert_int_equal(kill(w, SIGKILL), 0);
	assert_int_equal(kvt_wait(w), 128 + SIGKILL);
	for (i = 0; i < 2; i++) {
		child_result(&ch[i], &res[i]);
		assert_int_equal(res[i].run.cache_err, 0);
		assert_memory_equal(res[i].logits, cold, model.cfg.vocab_size * sizeof(float));
		computed += res[i].run.computed;
	}
	printf("waits %llu: served %llu, timed out %llu, lost %llu (before: %llu)\n",
	       (unsigned long long)STAT(waits), (unsigned long long)STAT(wait_served),
	       (unsigned long long)STAT(wait_timeouts), (unsigned long long)STAT(wait_lost),
	       (unsigned long long)lost);
	/* The first of them to look again lost its writer and computed the
	 * prompt; the other lost it too and waited for that one in turn, or
	 * found the prompt published already when it looked (served). No
	 * wait ran into its timeout. */
	UNTIL(STAT(clients_attached) == 0);
	assert_true(STAT(wait_lost) >= lost + 1);
	assert_true(STAT(wait_lost) - lost + STAT(wait_served) - served >= 2);
	assert_int_equal(STAT(wait_timeouts), timeouts);
	assert_true(computed <= NTOK + 2 * BT);
	assert_int_equal(STAT(pages_in_flight), 0);
}

/* Write each granted block of an 8-block request with its key's pattern. */
static void fill_blocks(kvc_t *c, struct kvc_req *r, const uint32_t *t)
{
	struct kvc_key k[8];

	assert_int_equal(kvc_keys(c, t, 8 * BT, NULL, 0, k, 8), 8);
	for (int i = 0; i < 8; i++)
		kvt_fill(kvc_block(r, (size_t)i), 4096, k[i]);
}

/* A waiter with a short timeout goes on alone and publishes; its publish
 * takes the stuck writer's announcement over. */
static void test_short_timeout_goes_on(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model km = kvt_model();
	uint64_t timeouts = STAT(wait_timeouts);
	uint32_t t[8 * BT];
	struct kvc_req *r;
	kvc_t *c = kvt_open(d, NULL);
	pid_t w;

	assert_non_null(c);
	w = stuck_writer(d, &km, 303, 8 * BT);
	prompt(t, 8 * BT, 303);
	assert_int_equal(kvc_req_new(c, t, 8 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_req_inflight(r), 8);
	assert_int_equal(kvc_wait(r, 20), 0);
	assert_int_equal(kvc_req_inflight(r), 0);
	assert_int_equal(kvc_alloc(r), 8);
	fill_blocks(c, r, t);
	assert_int_equal(kvc_publish(r), 8);
	kvc_req_free(r);
	UNTIL(STAT(wait_timeouts) == timeouts + 1);
	/* Cached now, though the stuck writer still holds its pages. */
	assert_int_equal(kvt_get(c, t, 8 * BT), 8);
	assert_int_equal(kill(w, SIGKILL), 0);
	assert_int_equal(kvt_wait(w), 128 + SIGKILL);
	assert_int_equal(kvt_get(c, t, 8 * BT), 8);
	kvc_close(c);
}

/* A writer whose connection the daemon drops while its process lives on
 * keeps its pages until it exits, but nobody waits for them: the waiter
 * wakes to a miss at once, not at its (one minute) timeout. Run under an
 * alarm far below that timeout. */
static int wait_for_dropped(void *arg)
{
	const struct kvt_daemon *d = arg;
	uint32_t t[8 * BT];
	struct kvc_req *r;
	kvc_t *c = kvt_open(d, NULL);
	int i, h = -1;

	alarm(30);
	if (!c)
		return 2;
	prompt(t, 8 * BT, 304);
	/* The announcement may still be up for a moment before the drop. */
	for (i = 0; i < 100; i++) {
		if (kvc_req_new(c, t, 8 * BT, NULL, 0, &r) || kvc_lookup(r) != 0)
			return 3;
		if (!kvc_req_inflight(r))
			break;
		h = kvc_wait(r, 60000);
		kvc_req_free(r);
		if (h != 0)
			return 4;
	}
	kvc_close(c);
	return 0;
}

static void test_dropped_writer_wakes_waiters(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model km = kvt_model();
	pid_t w = stuck_writer_ex(d, &km, 304, 8 * BT, true);

	assert_int_equal(kvt_wait(kvt_fork(wait_for_dropped, d)), 0);
	assert_int_equal(kill(w, 0), 0);	/* the writer lives on */
	assert_int_equal(kill(w, SIGKILL), 0);
	assert_int_equal(kvt_wait(w), 128 + SIGKILL);
}

/* ---- in one process: a waiter thread with its own handle ---- */

struct waiter {
	const struct kvt_daemon *d;
	const uint32_t *t;
	int seen;		/* in flight at its lookup */
	int hits;		/* what kvc_wait returned */
	int pages_ok;
	int ready[2];
};

static void *waiter_main(void *arg)
{
	struct waiter *wt = arg;
	struct kvc_req *r;
	kvc_t *c = kvt_open(wt->d, NULL);

	if (!c || kvc_req_new(c, wt->t, 8 * BT, NULL, 0, &r) || kvc_lookup(r)) {
		wt->seen = -1;
	} else {
		wt->seen = (int)kvc_req_inflight(r);
		if (write(wt->ready[1], "s", 1) != 1)
			wt->seen = -1;
		struct kvc_key k[8];

		wt->hits = kvc_wait(r, LONG_MS);
		wt->pages_ok = kvc_keys(c, wt->t, 8 * BT, NULL, 0, k, 8) == 8;
		for (int i = 0; i < wt->hits; i++)
			wt->pages_ok &= kvt_check(kvc_block(r, (size_t)i), 4096, k[i]);
		kvc_req_free(r);
	}
	kvc_close(c);
	return NULL;
}

/*
 * The writer, on its own handle in this thread, announces 8 blocks; the
 * waiter thread sees them in flight and waits; the writer then publishes
 * them (the waiter wakes with 8 hits holding the writer's bytes) or gives
 * its pages back (the waiter wakes with none).
 */
static void writer_then(struct kvt_daemon *d, uint32_t seed, bool publish)
{
	struct waiter wt = { .d = d };
	uint32_t t[8 * BT];
	struct kvc_req *r;
	pthread_t th;
	kvc_t *c = kvt_open(d, NULL);
	char b;

	assert_non_null(c);
	prompt(t, 8 * BT, seed);
	wt.t = t;
	assert_int_equal(pipe(wt.ready), 0);
	assert_int_equal(kvc_req_new(c, t, 8 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), 8);
	/* Our own blocks are never reported in flight to us. */
	{
		struct kvc_req *mine;

		assert_int_equal(kvc_req_new(c, t, 8 * BT, NULL, 0, &mine), 0);
		assert_int_equal(kvc_lookup(mine), 0);
		assert_int_equal(kvc_req_inflight(mine), 0);
		kvc_req_free(mine);
	}
	assert_int_equal(pthread_create(&th, NULL, waiter_main, &wt), 0);
	assert_int_equal(read(wt.ready[0], &b, 1), 1);
	if (publish) {
		fill_blocks(c, r, t);
		assert_int_equal(kvc_publish(r), 8);
	}
	kvc_req_free(r);	/* unpublished: FREE */
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(wt.seen, 8);
	assert_int_equal(wt.hits, publish ? 8 : 0);
	assert_true(wt.pages_ok);
	close(wt.ready[0]);
	close(wt.ready[1]);
	kvc_close(c);
}

static void test_publish_wakes_waiter_with_hits(void **state)
{
	uint64_t served = STAT(wait_served), tokens = STAT(wait_tokens);

	writer_then(*state, 404, true);
	UNTIL(STAT(wait_served) == served + 1);
	assert_int_equal(STAT(wait_tokens), tokens + 8 * BT);
}

static void test_free_unpublished_wakes_waiter_with_miss(void **state)
{
	uint64_t lost = STAT(wait_lost);

	writer_then(*state, 505, false);
	UNTIL(STAT(wait_lost) == lost + 1);
	assert_int_equal(STAT(pages_in_flight), 0);
}

/* ---- the daemon dies while a client waits ---- */

static void *kill_later(void *arg)
{
	sleep_ms(100);
	kill(*(pid_t *)arg, SIGKILL);
	return NULL;
}

/*
 * A daemon SIGKILLed while a client waits for blocks another client
 * announced: nobody bumps the flight word, and the orphaned segment still
 * says the blocks are in flight. The wait must notice the daemon's end
 * (its socket hangs up) and return -ENOTCONN, not sleep out its timeout
 * and return as if the writer were merely slow.
 */
static void test_daemon_killed_ends_wait(void **state)
{
	struct kvc_model km = kvt_model();
	struct kvt_daemon d;
	uint32_t t[8 * BT];
	struct kvc_req *r;
	pthread_t th;
	int rc, alloc;
	kvc_t *c;
	pid_t w;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, daemon_args), 0);
	w = stuck_writer(&d, &km, 707, 8 * BT);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	prompt(t, 8 * BT, 707);
	assert_int_equal(kvc_req_new(c, t, 8 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_req_inflight(r), 8);
	assert_int_equal(pthread_create(&th, NULL, kill_later, &d.pid), 0);
	/* Without the check the wait sleeps 20 s and returns 0 hits. */
	rc = kvc_wait(r, 20000);
	pthread_join(th, NULL);
	alloc = kvc_alloc(r);
	kvc_req_free(r);
	kvc_close(c);
	kill(w, SIGKILL);
	assert_int_equal(kvt_wait(w), 128 + SIGKILL);
	assert_int_equal(kvt_daemon_stop(&d), -1);	/* it died by a signal */
	assert_int_equal(rc, -ENOTCONN);
	assert_int_equal(alloc, -ENOTCONN);
}

/* ---- a writer that gives its blocks up and announces them again ---- */

/*
 * A hostile writer on the raw protocol: it announces the 8 blocks of the
 * prompt (ALLOC_KEYS), then every 500 ms gives its pages back and
 * announces the blocks again, FREE and ALLOC_KEYS in one write, so each
 * FREE wakes the waiters and the next announcement is there before they
 * allocate. Writes one byte on `ready` after the first announcement; runs
 * until killed.
 */
static pid_t refreshing_writer(const struct kvt_daemon *d, uint32_t seed, int ready)
{
	pid_t p = fork();

	assert_true(p >= 0);
	if (!p) {
		struct kvproto_hello hi = { .version = KVPROTO_VERSION, .dtype_bytes = 2,
					    .layers = 1, .kv_heads = 2, .head_dim = 32,
					    .block_tokens = BT, .pos_kind = 1,
					    .model = "kvt-tiny" };
		struct kvproto_hello_r hr;
		struct kvshm_key keys[8], root, zero = { 0, 0 };
		struct kvshm_ns ns;
		struct {
			struct kvproto_hdr h1;
			struct kvproto_count fc;
			struct kvproto_pg fpg[8];
			struct kvproto_hdr h2;
			struct kvproto_alloc a;
			struct kvproto_claim cl[8];
		} __attribute__((packed)) m;
		struct {
			struct kvproto_count cnt;
			struct kvproto_pg pg[8];
		} ar;
		uint32_t t[8 * BT];
		int fds[3], fd = kvt_raw_connect(d->sock), i;

		if (fd < 0 || kvt_raw_hello(fd, fds, &hr) || kvproto_hello_ns(&hi, &ns))
			_exit(3);
		prompt(t, 8 * BT, seed);
		root = kvshm_key_root(ns.id, NULL, 0);
		kvshm_key_chain(root, root, zero, t, 8 * BT, BT, keys);
		memset(&m, 0, sizeof(m));
		m.h1 = (struct kvproto_hdr){ KVPROTO_MAGIC, KVPROTO_FREE, 0,
					     sizeof(m.fc) + sizeof(m.fpg), 1 };
		m.fc.n = 8;
		m.h2 = (struct kvproto_hdr){ KVPROTO_MAGIC, KVPROTO_ALLOC_KEYS, 0,
					     sizeof(m.a) + sizeof(m.cl), 2 };
		m.a.n = 8;
		for (i = 0; i < 8; i++)
			m.cl[i] = (struct kvproto_claim){ keys[i], i ? keys[i - 1] : root };
		if (write(fd, (char *)&m + offsetof(typeof(m), h2),
			  sizeof(m) - offsetof(typeof(m), h2)) !=
			    (ssize_t)(sizeof(m) - offsetof(typeof(m), h2)) ||
		    kvt_read_frame(fd, KVPROTO_ALLOC_R, &ar, sizeof(ar)) != (int)sizeof(ar) ||
		    ar.cnt.n != 8 || write(ready, "a", 1) != 1)
			_exit(4);
		for (;;) {
			struct kvproto_count fr;

			sleep_ms(500);
			memcpy(m.fpg, ar.pg, sizeof(m.fpg));
			if (write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m) ||
			    kvt_read_frame(fd, KVPROTO_FREE_R, &fr, sizeof(fr)) != (int)sizeof(fr) ||
			    kvt_read_frame(fd, KVPROTO_ALLOC_R, &ar, sizeof(ar)) != (int)sizeof(ar) ||
			    ar.cnt.n != 8)
				_exit(5);
		}
	}
	return p;
}

/* The honest client: kvclient.h's documented loop, 2 s waits, under an
 * alarm far above that (a loop that never ends fails the test). */
static int documented_loop(void *arg)
{
	const struct kvt_daemon *d = arg;
	uint32_t t[8 * BT];
	struct kvc_key k[8];
	struct kvc_req *r;
	kvc_t *c = kvt_open(d, NULL);
	int hits, got, rounds = 0;

	alarm(40);
	if (!c)
		return 2;
	prompt(t, 8 * BT, 808);
	if (kvc_req_new(c, t, 8 * BT, NULL, 0, &r) || kvc_lookup(r) != 0 ||
	    kvc_req_inflight(r) != 8)
		return 3;
	do {
		hits = kvc_wait(r, 2000);
		if (hits < 0)
			return 4;
		got = kvc_alloc(r);
		rounds++;
	} while (got == -EINPROGRESS);
	printf("documented loop: %d rounds, %d hits, %d granted\n", rounds, hits, got);
	fflush(stdout);
	if (hits + got != 8 || kvc_keys(c, t, 8 * BT, NULL, 0, k, 8) != 8)
		return 5;
	for (int i = hits; i < 8; i++)
		kvt_fill(kvc_block(r, (size_t)i), 4096, k[i]);
	if (kvc_publish(r) != 8)
		return 6;
	kvc_req_free(r);
	kvc_close(c);
	return 0;
}

static void test_refreshing_writer_cannot_keep_a_waiter(void **state)
{
	struct kvt_daemon *d = *state;
	int ready[2], rc, alive;
	pid_t w;
	char b;

	assert_int_equal(pipe(ready), 0);
	w = refreshing_writer(d, 808, ready[1]);
	assert_int_equal(read(ready[0], &b, 1), 1);
	rc = kvt_wait(kvt_fork(documented_loop, d));
	alive = kill(w, 0);	/* it was refreshing all along */
	kill(w, SIGKILL);
	assert_int_equal(kvt_wait(w), 128 + SIGKILL);
	close(ready[0]);
	close(ready[1]);
	assert_int_equal(alive, 0);
	assert_int_equal(rc, 0);
}

/*
 * max-announced: a client holding that many pages WRITING gets further
 * pages unannounced, so no client fills the index with claims it never
 * writes. A writer granted 8 pages under a cap of 3 has announced 3:
 * others see 3 blocks in flight and compute the rest.
 */
static void test_announcements_capped(void **state)
{
	static const char *const args[] = { "--page-size", "8K", "--pool-size", "2M",
					    "--max-announced", "3", NULL };
	struct kvc_model km = kvt_model();
	struct kvshm_stats st;
	struct kvt_daemon d;
	uint32_t t[8 * BT];
	struct kvc_req *r;
	size_t inflight;
	int tries;
	kvc_t *c;
	pid_t w;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	w = stuck_writer(&d, &km, 909, 8 * BT);	/* granted all 8 */
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	prompt(t, 8 * BT, 909);
	assert_int_equal(kvc_req_new(c, t, 8 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	inflight = kvc_req_inflight(r);
	kvc_req_free(r);
	kvc_close(c);
	for (tries = 0; tries < 200; tries++) {	/* the gauge is set on a tick */
		kvt_stats(d.sock, &st);
		if (st.pages_in_flight == 3)
			break;
		sleep_ms(5);
	}
	kill(w, SIGKILL);
	assert_int_equal(kvt_wait(w), 128 + SIGKILL);
	assert_int_equal(kvt_daemon_stop(&d), 0);
	assert_int_equal(inflight, 3);
	assert_int_equal(st.pages_in_flight, 3);
}

/* API edges: bad arguments, and a wait with nothing in flight. */
static void test_wait_arguments(void **state)
{
	struct kvt_daemon *d = *state;
	uint32_t t[4 * BT];
	struct kvc_req *r;
	kvc_t *c = kvt_open(d, NULL);

	assert_non_null(c);
	prompt(t, 4 * BT, 606);
	assert_int_equal(kvc_wait(NULL, 10), -EINVAL);
	assert_int_equal(kvc_req_inflight(NULL), 0);
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_wait(r, 10), -EINVAL);	/* before the lookup */
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_wait(r, -1), -EINVAL);
	assert_int_equal(kvc_wait(r, LONG_MS), 0);	/* nothing in flight: at once */
	assert_int_equal(kvc_alloc(r), 4);
	assert_int_equal(kvc_wait(r, 10), -EINVAL);	/* after the alloc */
	kvc_req_free(r);
	kvc_close(c);
}

static int setup(void **state)
{
	char err[256];
	struct kvt_daemon *d;

	if (kvt_tlm_model(&model, err, sizeof(err)) ||
	    kvt_setup_args(state, daemon_args))
		return -1;
	d = *state;
	return kvobs_attach(d->sock, &obs, err, sizeof(err)) ? -1 : 0;
}

static int teardown(void **state)
{
	kvobs_detach(&obs);
	tlm_model_free(&model);
	return kvt_teardown(state);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_three_at_once_prefill_once),
		cmocka_unit_test(test_writer_killed_waiters_compute),
		cmocka_unit_test(test_short_timeout_goes_on),
		cmocka_unit_test(test_dropped_writer_wakes_waiters),
		cmocka_unit_test(test_publish_wakes_waiter_with_hits),
		cmocka_unit_test(test_free_unpublished_wakes_waiter_with_miss),
		cmocka_unit_test(test_wait_arguments),
		cmocka_unit_test(test_daemon_killed_ends_wait),
		cmocka_unit_test(test_refreshing_writer_cannot_keep_a_waiter),
		cmocka_unit_test(test_announcements_capped),
	};

	/* KVT_ONLY=test_name runs one (checking a test against a reverted fix). */
	if (getenv("KVT_ONLY"))
		cmocka_set_test_filter(getenv("KVT_ONLY"));
	return cmocka_run_group_tests_name("flight", tests, setup, teardown);
}
