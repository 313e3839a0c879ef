// SPDX-License-Identifier: MIT
/*
 * pool.c (GPU) - kvcached --pool cuda with real client processes: the
 * daemon's VMM chunks are imported and mapped by each client; one client
 * scatters a known pattern from device tensors into granted pages and
 * publishes, another looks the blocks up and gathers them into its own
 * device tensors (the other layout), every byte checked; a client killed
 * while it holds pins, granted pages and the pool mapped does not stop
 * the daemon from reclaiming, evicting and reusing those pages. This
 * process never initialises CUDA itself (only forked clients do: CUDA
 * state does not survive fork). Skips, saying why, without a usable GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "../lib/harness.h"

#define BT 16

static const char *missing;

#define SKIP_IF_NO_GPU()                                                   \
	do {                                                               \
		if (missing) {                                             \
			print_message("[  SKIP    ] no GPU: %s\n", missing);   \
			skip();                                            \
		}                                                          \
	} while (0)

/* 64 pages of 16 KiB on GPU 0. */
static const char *const daemon_args[] = {
	"--pool", "cuda", "--gpu", "0", "--page-size", "16K", "--pool-size", "1M", NULL,
};

/* 4 layers x 2 heads x 32 dims x 2 bytes x 16 tokens: 16 KiB pages. */
static __attribute__((unused)) struct kvc_model model(void)
{
	struct kvc_model m = kvt_model();

	m.name = "gpu-pool";
	m.layers = 4;
	m.kv_heads = 2;
	m.head_dim = 32;
	return m;
}

struct job {
	const char *sock;
	uint32_t seed;
	uint32_t kind;
	int prompts;	/* flood: how many; fetch: -1 gathers layer by layer */
};

#ifdef KVC_HAVE_CUDA
static int with_gpu(struct kvt_mem *mem)
{
	return kvt_gpu_mem(0, mem);
}

static int publish_job(void *arg)
{
	struct job *j = arg;
	struct kvc_model m = model();
	uint32_t t[6 * BT + 3];
	struct kvt_mem mem;

	if (with_gpu(&mem))
		return 90;
	kvt_tokens(t, 6 * BT + 3, 0, j->seed);
	return kvt_engine_publish(j->sock, &m, t, 6 * BT + 3, j->kind, &mem) == 6 ? 0 : 91;
}

static int fetch_job(void *arg)
{
	struct job *j = arg;
	struct kvc_model m = model();
	uint32_t t[6 * BT + 3];
	struct kvt_mem mem;
	int rc;

	if (with_gpu(&mem))
		return 90;
	if (j->prompts < 0)	/* layer by layer, an event per layer */
		mem.gather = kvt_gpu_gather_by_layer;
	kvt_tokens(t, 6 * BT + 3, 0, j->seed);
	rc = kvt_engine_fetch(j->sock, &m, t, 6 * BT + 3, j->kind, &mem);
	return rc ? 100 + (-rc - 1000) : 0;
}

/* Attach, publish one prompt, take pages for another, and die holding
 * pins, WRITING pages and the mapped pool. */
static int die_job(void *arg)
{
	struct job *j = arg;
	struct kvc_model m = model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = j->sock };
	uint32_t t[6 * BT];
	struct kvc_req *r;
	kvc_t *c;

	if (publish_job(arg))
		return 92;
	if (kvc_open(&m, &o, &c) || kvc_pool_kind(c) != KVC_POOL_CUDA || kvc_pool_device(c) < 0)
		return 93;
	kvt_tokens(t, 6 * BT, 0, j->seed);
	if (kvc_req_new(c, t, 6 * BT, NULL, 0, &r) || kvc_lookup(r) != 6)
		return 94;	/* 6 pins */
	kvt_tokens(t, 6 * BT, 0, j->seed + 1);
	if (kvc_req_new(c, t, 6 * BT, NULL, 0, &r) || kvc_lookup(r) != 0 || kvc_alloc(r) != 6)
		return 95;	/* 6 WRITING pages */
	raise(SIGKILL);
	return 96;
}

/* A layout of plain host pointers on a cuda pool is refused before any
 * kernel runs (-EFAULT), and the context stays usable: the same gather
 * with device tensors then works. */
static int efault_job(void *arg)
{
	struct job *j = arg;
	struct kvc_model m = model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = j->sock };
	uint32_t t[6 * BT];
	struct kvt_engine e;
	struct kvc_layout l;
	struct kvc_req *r;
	struct kvt_mem mem;
	void *tk[8], *tv[8];
	int64_t ids[6] = { 0, 1, 2, 3, 4, 5 };
	kvc_t *c;
	int rc;

	if (publish_job(arg) || with_gpu(&mem))
		return 80;
	if (kvc_open(&m, &o, &c))
		return 81;
	kvt_tokens(t, 6 * BT, 0, j->seed);
	if (kvc_req_new(c, t, 6 * BT, NULL, 0, &r) || kvc_lookup(r) != 6 ||
	    kvt_engine_new(&e, &m, KVC_LAYOUT_KV, 6, 0))
		return 82;
	l = kvt_engine_layout(&e, (void *const *)e.k, (void *const *)e.v);
	if ((rc = kvc_gather(r, 0, 6, &l, ids, mem.stream)) != -EFAULT)
		return 83;
	if (mem.upload(&e, tk, tv))
		return 84;
	l = kvt_engine_layout(&e, tk, tv);
	if (kvc_gather(r, 0, 6, &l, ids, mem.stream) || mem.sync(mem.stream) ||
	    mem.download(&e, tk, tv))
		return 85;
	for (int i = 0; i < 6; i++) {
		struct kvc_key k[6];

		if (kvc_keys(c, t, 6 * BT, NULL, 0, k, 6) != 6 || !kvt_engine_has(&e, (uint64_t)i, k[i]))
			return 86;
	}
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
	return 0;
}

/* Publish `prompts` fresh prompts (6 pages each): the pool turns over. */
static int flood_job(void *arg)
{
	struct job *j = arg;
	int i;

	for (i = 0; i < j->prompts; i++) {
		struct job one = { j->sock, j->seed + (uint32_t)i, KVC_LAYOUT_KV, 0 };

		if (publish_job(&one))
			return 97;
	}
	/* The newest prompt is whole, byte for byte. */
	{
		struct job last = { j->sock, j->seed + (uint32_t)j->prompts - 1, KVC_LAYOUT_FLASH, 0 };

		return fetch_job(&last);
	}
}
#endif

static void test_two_processes_share_gpu_pages(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job w = { d->sock, 501, KVC_LAYOUT_KV, 0 }, r = { d->sock, 501, KVC_LAYOUT_FLASH, 0 };
		struct job w2 = { d->sock, 502, KVC_LAYOUT_FLASH, 0 }, r2 = { d->sock, 502, KVC_LAYOUT_KV, 0 };

		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r)), 0);
		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w2)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r2)), 0);
		r2.prompts = -1;	/* kvc_gather_v2, an event per layer */
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r2)), 0);
	}
#endif
}

static void test_host_pointers_refused(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job j = { d->sock, 503, KVC_LAYOUT_KV, 0 };

		assert_int_equal(kvt_wait(kvt_fork(efault_job, &j)), 0);
	}
#endif
}

static void test_killed_client_pages_reused(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job die = { d->sock, 601, KVC_LAYOUT_KV, 0 };
		/* 30 prompts x 6 pages: about three times the 64-page pool. */
		struct job flood = { d->sock, 700, KVC_LAYOUT_KV, 30 };

		assert_int_equal(kvt_wait(kvt_fork(die_job, &die)), 128 + SIGKILL);
		assert_int_equal(kvt_wait(kvt_fork(flood_job, &flood)), 0);
		assert_true(kvt_log_has(d, "6 writing pages reclaimed"));
		assert_true(kvt_log_has(d, "evicted "));
	}
#endif
}

static int setup(void **state)
{
	*state = NULL;
	missing = kvt_gpu_missing();
	if (missing)
		return 0;
	return kvt_setup_args(state, daemon_args);
}

static int teardown(void **state)
{
	return *state ? kvt_teardown(state) : 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_processes_share_gpu_pages),
		cmocka_unit_test(test_host_pointers_refused),
		cmocka_unit_test(test_killed_client_pages_reused),
	};

	return cmocka_run_group_tests_name("gpu/pool", tests, setup, teardown);
}
