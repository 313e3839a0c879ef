// SPDX-License-Identifier: MIT
/*
 * hostpool.c (GPU) - a host pool shared with GPU engines (issue #32): the
 * client registers the pool with CUDA (kvc_gpu_prepare) and the page
 * kernels move pages between it and device tensors. Real client
 * processes on a real host-pool daemon:
 *   - a prepared publisher scatters a known pattern from device tensors
 *     and publishes; a prepared reader gathers into its own device
 *     tensors (the other layout) and every byte is checked; the status
 *     says every chunk is registered;
 *   - the same without kvc_gpu_prepare: the first copy prepares the GPU
 *     itself and copies pages of chunks not yet registered per piece, so
 *     the bytes are right whatever the registration has reached;
 *   - layer by layer with an event per layer (kvc_gather_v2): each
 *     layer's event waited for alone, then the bytes;
 *   - a host pointer in a KVC_LAYOUT_DEVICE layout is refused (-EFAULT)
 *     before any kernel runs.
 * The pool (640 MiB) spans three registration chunks. This process never
 * initialises CUDA (only forked clients do). Skips, saying why, without
 * a usable GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
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

static const char *const daemon_args[] = {
	"--page-size", "16K", "--pool-size", "640M", NULL,
};

/* 4 layers x 2 heads x 32 dims x 2 bytes x 16 tokens: 16 KiB pages. */
static __attribute__((unused)) struct kvc_model model(void)
{
	struct kvc_model m = kvt_model();

	m.name = "gpu-hostpool";
	m.layers = 4;
	m.kv_heads = 2;
	m.head_dim = 32;
	return m;
}

struct job {
	const char *sock;
	uint32_t seed;
	uint32_t kind;
	bool prepare;
	bool per_layer;
};

#ifdef KVC_HAVE_CUDA
static int with_gpu(struct kvt_mem *mem, const struct job *j)
{
	if (kvt_gpu_mem(0, mem))
		return -1;
	mem->device_layout = true;
	mem->prepare = j->prepare;
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
	if (j->per_layer)
		mem.gather = kvt_gpu_gather_by_layer;
	kvt_tokens(t, 6 * BT + 3, 0, j->seed);
	rc = kvt_engine_fetch(j->sock, &m, t, 6 * BT + 3, j->kind, &mem);
	return rc ? 100 + (-rc - 1000) : 0;
}

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

/* Host memory in a device layout: refused before any kernel, and the
 * context still works. */
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

	if (publish_job(arg) || with_gpu(&mem, j))
		return 80;
	if (kvc_open(&m, &o, &c) || kvc_gpu_prepare(c, 0, 0))
		return 81;
	kvt_tokens(t, 6 * BT, 0, j->seed);
	if (kvc_req_new(c, t, 6 * BT, NULL, 0, &r) || kvc_lookup(r) != 6 ||
	    kvt_engine_new(&e, &m, KVC_LAYOUT_KV, 6, 0))
		return 82;
	l = kvt_engine_layout(&e, (void *const *)e.k, (void *const *)e.v);
	l.flags = KVC_LAYOUT_DEVICE;
	if (kvc_gather(r, 0, 6, &l, ids, mem.stream) != -EFAULT)
		return 83;
	if (mem.upload(&e, tk, tv))
		return 84;
	l = kvt_engine_layout(&e, tk, tv);
	l.flags = KVC_LAYOUT_DEVICE;
	if (kvc_gather(r, 0, 6, &l, ids, mem.stream) || mem.sync(mem.stream) ||
	    mem.download(&e, tk, tv))
		return 85;
	{
		struct kvc_key k[6];

		if (kvc_keys(c, t, 6 * BT, NULL, 0, k, 6) != 6)
			return 86;
		for (int i = 0; i < 6; i++)
			if (!kvt_engine_has(&e, (uint64_t)i, k[i]))
				return 87;
	}
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
	return 0;
}
#endif

static void test_prepared_roundtrip(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job s = { d->sock, 0, 0, true, false };
		struct job w = { d->sock, 801, KVC_LAYOUT_KV, true, false };
		struct job r = { d->sock, 801, KVC_LAYOUT_FLASH, true, false };
		struct job w2 = { d->sock, 802, KVC_LAYOUT_FLASH, true, false };
		struct job r2 = { d->sock, 802, KVC_LAYOUT_KV, true, false };

		assert_int_equal(kvt_wait(kvt_fork(status_job, &s)), 0);
		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r)), 0);
		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w2)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r2)), 0);
	}
#endif
}

static void test_unprepared_roundtrip(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job w = { d->sock, 803, KVC_LAYOUT_KV, false, false };
		struct job r = { d->sock, 803, KVC_LAYOUT_FLASH, false, false };

		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r)), 0);
	}
#endif
}

static void test_layer_events(void **state)
{
	struct kvt_daemon *d = *state;

	SKIP_IF_NO_GPU();
	assert_non_null(d);
#ifdef KVC_HAVE_CUDA
	{
		struct job w = { d->sock, 804, KVC_LAYOUT_FLASH, true, false };
		struct job r = { d->sock, 804, KVC_LAYOUT_KV, true, true };
		struct job r2 = { d->sock, 804, KVC_LAYOUT_FLASH, false, true };

		assert_int_equal(kvt_wait(kvt_fork(publish_job, &w)), 0);
		assert_int_equal(kvt_wait(kvt_fork(fetch_job, &r)), 0);
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
		struct job j = { d->sock, 805, KVC_LAYOUT_KV, true, false };

		assert_int_equal(kvt_wait(kvt_fork(efault_job, &j)), 0);
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
		cmocka_unit_test(test_prepared_roundtrip),
		cmocka_unit_test(test_unprepared_roundtrip),
		cmocka_unit_test(test_layer_events),
		cmocka_unit_test(test_host_pointers_refused),
	};

	return cmocka_run_group_tests_name("gpu/hostpool", tests, setup, teardown);
}
