// SPDX-License-Identifier: MIT
/*
 * threads.c - one kvc_t shared by threads, as an engine with several
 * worker threads uses it: concurrent lookups, allocations, publishes and
 * releases on overlapping prompts. Checks page bytes on every hit and that
 * every pin slot comes back. Run under `make test-tsan` this is where the
 * client library's in-process sharing is checked for races.
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_share_one_handle),
		cmocka_unit_test(test_threads_share_alloc_ahead),
	};

	return cmocka_run_group_tests_name("integration/threads", tests, NULL, NULL);
}
