// SPDX-License-Identifier: MIT
/*
 * pool.c (GPU) - kvcached --pool cuda with real client processes: the
 * daemon's VMM chunks are imported and mapped by each client; one client
 * scatters a known pattern from device tensors into granted pages and
 * publishes, another looks the blocks up and gathers them into its own
 * device tensors (the other layout), every byte checked; a client killed
 * while it holds pins, granted pages and the pool mapped does not stop
 * the daemon from reclaiming, evicting and reusing those pages.
 *
 * gpu/hostpool, the second group: a host pool shared with GPU engines
 * (issue #32), the same jobs with device tensors in KVC_LAYOUT_DEVICE
 * layouts: the client registers the pool with CUDA (kvc_gpu_prepare) and
 * the page kernels copy over the bus. Prepared and waited for (the status
 * says every chunk is registered); not prepared (the first copy prepares
 * the GPU itself and copies pages of chunks not registered yet per
 * piece, so the bytes are right whatever registration has reached); an
 * event per layer; host pointers in a device layout refused. Its pool,
 * 640 MiB, spans three registration chunks.
 *
 * This process never initialises CUDA itself (only forked clients do:
 * CUDA state does not survive fork). Skips, saying why, without a usable
 * GPU.
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

#define BT 16

static const char *missing;

#define SKIP_IF_NO_GPU() KVT_GPU_SKIP_IF_MISSING(missing)

/* 64 pages of 16 KiB on GPU 0. */
static const char *const daemon_args[] = {
	"--pool", "cuda", "--gpu", "0", "--page-size", "16K", "--pool-size", "1M", NULL,
};

/* gpu/hostpool: 640 MiB of host memory, three KVC_GPU_CHUNK chunks. */
static const char *const host_args[] = {
	"--page-size", "16K", "--pool-size", "640M", NULL,
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
	bool host;	/* a host pool: device layouts */
	bool prepare;	/* host: kvc_gpu_prepare(KVC_GPU_WAIT) at attach */
};

#ifdef KVC_HAVE_CUDA
static int with_gpu(struct kvt_mem *mem, const struct job *j)
{
	if (kvt_gpu_mem(0, mem))
		return -1;
	mem->device_layout = j->host;
	mem->prepare = j->host && j->prepare;
	mem->prepare_flags = KVC_GPU_WAIT;
	return 0;
}

static int publish_job(void *arg)
{
	struct job *j = arg;
	struct kvc_model m = model();
	uint32_t t[6 * BT + 3];
	struct kvt_mem mem;

	if (with_gpu(&mem, j))
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

	if (with_gpu(&mem, j))
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

	if (publish_job(arg) || with_gpu(&mem, j))
		return 80;
	if (kvc_open(&m, &o, &c) || (j->host && kvc_gpu_prepare(c, 0, 0)))
		return 81;
	kvt_tokens(t, 6 * BT, 0, j->seed);
	if (kvc_req_new(c, t, 6 * BT, NULL, 0, &r) || kvc_lookup(r) != 6 ||
	    kvt_engine_new(&e, &m, KVC_LAYOUT_KV, 6, 0))
		return 82;
	l = kvt_engine_layout(&e, (void *const *)e.k, (void *const *)e.v);
	l.flags = j->host ? KVC_LAYOUT_DEVICE : 0;
	if ((rc = kvc_gather(r, 0, 6, &l, ids, mem.stream)) != -EFAULT)
		return 83;
	if (mem.upload(&e, tk, tv))
		return 84;
	l = kvt_engine_layout(&e, tk, tv);
	l.flags = j->host ? KVC_LAYOUT_DEVICE : 0;
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
		struct job one = { j->sock, j->seed + (uint32_t)i, KVC_LAYOUT_KV, 0, false, false };

		if (publish_job(&one))
			return 97;
	}
	/* The newest prompt is whole, byte for byte. */
	{
		struct job last = { j->sock, j->seed + (uint32_t)j->prompts - 1, KVC_LAYOUT_FLASH, 0,
				    false, false };

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

#ifdef KVC_HAVE_CUDA
/* Prepared and waited for: every chunk registered, in measured time. */
static int status_job(void *arg)
{
	struct job *j = arg;
	struct kvc_model m = model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = j->sock };
	struct kvc_gpu_status st = { .size = sizeof(st) };
	kvc_t *c;
	int rc = 0;

	if (kvc_open(&m, &o, &c))
		return 70;
	if (kvc_gpu_prepare(c, 0, KVC_GPU_WAIT) || kvc_gpu_status(c, &st))
		rc = 71;
	else if (st.state != KVC_GPU_READY || st.device != 0 || st.chunks != 3 ||
		 st.chunks_registered != 3 || st.bytes_registered != 640ull << 20 ||
		 !st.register_ns)
		rc = 72;
	else if (kvc_gpu_prepare(c, 0, 0))	/* again: nothing more to do */
		rc = 73;
	print_message("registered %u chunks, %llu bytes in %.3f s\n", st.chunks_registered,
		      (unsigned long long)st.bytes_registered, (double)st.register_ns / 1e9);
	kvc_close(c);
	return rc;
}

#endif

static void test_host_prepared_roundtrip(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job s = { d->sock, 0, 0, 0, true, true };
		struct job w = { d->sock, 801, KVC_LAYOUT_KV, 0, true, true };
		struct job r = { d->sock, 801, KVC_LAYOUT_FLASH, 0, true, true };
		struct job w2 = { d->sock, 802, KVC_LAYOUT_FLASH, 0, true, true };
		struct job r2 = { d->sock, 802, KVC_LAYOUT_KV, 0, true, true };

		assert_int_equal(kvt_wait(kvt_fork(status_job, &s)), 0);
		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r)), 0);
		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w2)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r2)), 0);
		r2.prompts = -1;	/* an event per layer */
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r2)), 0);
	}
#endif
}

static void test_host_unprepared_roundtrip(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job w = { d->sock, 803, KVC_LAYOUT_KV, 0, true, false };
		struct job r = { d->sock, 803, KVC_LAYOUT_FLASH, 0, true, false };

		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r)), 0);
		r.prompts = -1;
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r)), 0);
	}
#endif
}

static void test_host_pointers_refused_on_a_host_pool(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job j = { d->sock, 805, KVC_LAYOUT_KV, 0, true, true };

		assert_int_equal(kvt_wait(kvt_fork(efault_job, &j)), 0);
	}
#endif
}

static int setup(void **state)
{
	return kvt_gpu_setup(state, &missing, daemon_args);
}

static int host_setup(void **state)
{
	return kvt_gpu_setup(state, &missing, host_args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_processes_share_gpu_pages),
		cmocka_unit_test(test_host_pointers_refused),
		cmocka_unit_test(test_killed_client_pages_reused),
	};
	const struct CMUnitTest host[] = {
		cmocka_unit_test(test_host_prepared_roundtrip),
		cmocka_unit_test(test_host_unprepared_roundtrip),
		cmocka_unit_test(test_host_pointers_refused_on_a_host_pool),
	};

	return cmocka_run_group_tests_name("gpu/pool", tests, setup, kvt_gpu_teardown) +
	       cmocka_run_group_tests_name("gpu/hostpool", host, host_setup, kvt_gpu_teardown);
}
