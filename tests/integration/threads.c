// SPDX-License-Identifier: MIT
/*
 * threads.c - one kvc_t shared by threads, as an engine with several
 * worker threads uses it: concurrent lookups, allocations, publishes and
 * releases on overlapping prompts. Checks page bytes on every hit and that
 * every pin slot comes back. Run under `make test-tsan` this is where the
 * client library's in-process sharing is checked for races. Threads that
 * come and go (more than a handle has counter rows, more handles than a
 * thread keeps records of) give their cached pin slots back, and their
 * counts add up (libclient/slots.c).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>

#include "../lib/harness.h"

#define BT 16
#define THREADS 4
#define ROUNDS 40

struct job {
	kvc_t *c;
	int id;
	int bad;
};

static void *run(void *arg)
{
	struct job *j = arg;
	uint32_t t[8 * BT];
	int i, hits;

	for (i = 0; i < ROUNDS; i++) {
		/* 3 blocks shared by all threads, 5 that repeat per thread. */
		kvt_tokens(t, 8 * BT, 3 * BT, (uint32_t)(700 + j->id * 10 + i % 4));
		hits = kvt_put(j->c, t, 8 * BT, NULL);
		if (hits < 0 || (i >= 4 && hits != 8))
			j->bad++;
	}
	return NULL;
}

static void share_one_handle(uint32_t flags)
{
	struct kvt_daemon d;
	struct job jobs[THREADS];
	pthread_t th[THREADS];
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d.sock, .flags = flags };
	struct kvc_stats s;
	kvc_t *c;
	int i;

	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	for (i = 0; i < THREADS; i++) {
		jobs[i] = (struct job){ c, i, 0 };
		assert_int_equal(pthread_create(&th[i], NULL, run, &jobs[i]), 0);
	}
	for (i = 0; i < THREADS; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(jobs[i].bad, 0);
	}
	assert_int_equal(kvc_stats(c, &s), 0);
	assert_int_equal(s.lookups, THREADS * ROUNDS);
	if (!flags) {
		assert_int_equal(s.pins_held, 0);	/* every request released its pins */
		assert_int_equal(s.pages_writing, 0);
	} else {
		/* Only the pages held ahead, one slot each. */
		assert_true(s.pins_held <= 16);
	}
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

static void test_threads_share_one_handle(void **state)
{
	(void)state;
	share_one_handle(0);
}

/* The same with alloc-ahead: the pending ALLOC reply and the pages taken
 * ahead are shared by the threads too. */
static void test_threads_share_alloc_ahead(void **state)
{
	(void)state;
	share_one_handle(KVC_OPEN_ALLOC_AHEAD);
}

#define CHURN 40		/* threads, more than KVSHM_LEDGER_ROWS */
#define LONG 120		/* blocks: nearly all of the handle's 128 slots */

struct churn {
	kvc_t *c[6];
	const uint32_t *t;
	int bad;
};

/* A short-lived thread: 1-block lookups on every handle, round robin
 * (more handles than a thread keeps records of), then it exits. */
static void *churn_one(void *arg)
{
	struct churn *ch = arg;
	int i;

	for (i = 0; i < 12; i++)
		if (kvt_get(ch->c[i % 6], ch->t, BT) != 1)
			ch->bad++;
	return NULL;
}

static void test_thread_churn_gives_slots_back(void **state)
{
	struct kvt_daemon d;
	struct churn ch = { .bad = 0 };
	struct kvc_model m = kvt_model();
	/* Slots for the long prompt and a few more: a few kept by exited
	 * threads would cut its lookup short. */
	struct kvc_options o = { .size = sizeof(o), .socket_path = d.sock, .max_pins = LONG + 8 };
	uint32_t *t = malloc(LONG * BT * sizeof(*t));
	pthread_t th[CHURN];
	struct kvc_stats s;
	int i, k, cached;

	(void)state;
	assert_non_null(t);
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	for (k = 0; k < 6; k++)
		assert_int_equal(kvc_open(&m, &o, &ch.c[k]), 0);
	kvt_tokens(t, LONG * BT, 0, 4242);
	assert_int_equal(kvt_put(ch.c[0], t, LONG * BT, &cached), 0);
	assert_int_equal(cached, LONG);
	ch.t = t;
	for (i = 0; i < CHURN; i += 8) {	/* eight at a time */
		for (k = i; k < i + 8; k++)
			assert_int_equal(pthread_create(&th[k], NULL, churn_one, &ch), 0);
		for (k = i; k < i + 8; k++)
			assert_int_equal(pthread_join(th[k], NULL), 0);
	}
	assert_int_equal(ch.bad, 0);
	/* Every count of every thread, summed over the rows. */
	assert_int_equal(kvc_stats(ch.c[1], &s), 0);
	assert_int_equal(s.lookups, CHURN * 2);
	assert_int_equal(s.hit_blocks, CHURN * 2);
	assert_int_equal(s.pins_held, 0);
	/* Every slot back: each handle pins the whole long prompt again
	 * (slots kept by exited threads would cut it short). */
	for (k = 0; k < 6; k++)
		assert_int_equal(kvt_get(ch.c[k], t, LONG * BT), LONG);
	for (k = 0; k < 6; k++)
		kvc_close(ch.c[k]);
	free(t);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_share_one_handle),
		cmocka_unit_test(test_threads_share_alloc_ahead),
		cmocka_unit_test(test_thread_churn_gives_slots_back),
	};

	return cmocka_run_group_tests_name("integration/threads", tests, NULL, NULL);
}
