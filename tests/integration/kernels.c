// SPDX-License-Identifier: MIT
/*
 * kernels.c - kvc_scatter and kvc_gather on a host pool through the real
 * daemon: one process scatters a known KV pattern from its engine cache
 * into granted pages and publishes; another process looks the prompt up
 * and gathers the hits into its own engine cache, in the other layout,
 * and every byte is checked (and every byte it must not touch). Then the
 * errors each bad argument gets. tests/gpu/ runs the same on a cuda pool.
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

#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "../../shm/proto.h"

#include "../../kernels/cudadrv.h"
#include "../lib/engine.h"
#include "../lib/harness.h"

#define BT 16

static const char *const daemon_args[] = { "--page-size", "16K", NULL };

/* 3 layers x 2 heads x 16 dims x 2 bytes: 6 KiB pages. */
static struct kvc_model model_a(void)
{
	struct kvc_model m = kvt_model();

	m.name = "kernels-a";
	m.layers = 3;
	m.kv_heads = 2;
	m.head_dim = 16;
	return m;
}

/* 2 layers x 1 head x 64 dims x 4 bytes: exactly 16 KiB pages. */
static struct kvc_model model_b(void)
{
	struct kvc_model m = kvt_model();

	m.name = "kernels-b";
	m.layers = 2;
	m.kv_heads = 1;
	m.head_dim = 64;
	m.dtype_bytes = 4;
	return m;
}

struct job {
	const char *sock;
	struct kvc_model m;
	const uint32_t *t;
	size_t n;
	uint32_t kind;
};

static int fetch_job(void *arg)
{
	struct job *j = arg;
	int rc = kvt_engine_fetch(j->sock, &j->m, j->t, j->n, j->kind, NULL);

	return rc ? 100 + (-rc - 1000) : 0;
}

static void roundtrip(const struct kvt_daemon *d, struct kvc_model m, uint32_t seed,
		      uint32_t wkind, uint32_t rkind)
{
	uint32_t t[7 * BT + 5];
	struct job j = { d->sock, m, t, 7 * BT + 5, rkind };

	kvt_tokens(t, 7 * BT + 5, 0, seed);
	assert_int_equal(kvt_engine_publish(d->sock, &m, t, 7 * BT + 5, wkind, NULL), 7);
	/* Another process, the other layout: every byte checked there. */
	assert_int_equal(kvt_wait(kvt_fork(fetch_job, &j)), 0);
}

static void test_scatter_publish_gather_elsewhere(void **state)
{
	const struct kvt_daemon *d = *state;

	roundtrip(d, model_a(), 301, KVC_LAYOUT_KV, KVC_LAYOUT_FLASH);
	roundtrip(d, model_a(), 302, KVC_LAYOUT_FLASH, KVC_LAYOUT_KV);
	roundtrip(d, model_b(), 303, KVC_LAYOUT_KV, KVC_LAYOUT_KV);
	roundtrip(d, model_b(), 304, KVC_LAYOUT_FLASH, KVC_LAYOUT_FLASH);
}

static void test_errors(void **state)
{
	const struct kvt_daemon *d = *state;
	struct kvc_model m = model_a();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	uint32_t t[4 * BT];
	struct kvt_engine e;
	struct kvc_layout l, bad;
	struct kvc_req *r, *r2;
	int64_t ids[4] = { 0, 1, 2, 3 }, far[1] = { 4 }, neg[1] = { -1 };
	kvc_t *c;

	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(kvc_pool_kind(c), KVC_POOL_HOST);
	assert_int_equal(kvc_pool_device(c), -ENODEV);
	assert_int_equal(kvc_pool_kind(NULL), -EINVAL);
	assert_int_equal(kvc_pool_device(NULL), -EINVAL);
	assert_int_equal(kvt_engine_new(&e, &m, KVC_LAYOUT_KV, 4, 0), 0);
	l = kvt_engine_layout(&e, (void *const *)e.k, (void *const *)e.v);
	kvt_tokens(t, 4 * BT, 0, 310);
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);

	/* No page yet. */
	assert_int_equal(kvc_gather(r, 0, 1, &l, ids, NULL), -ENOENT);
	assert_int_equal(kvc_scatter(r, 0, 1, &l, ids, NULL), -ENOENT);
	assert_int_equal(kvc_alloc(r), 4);
	/* Bad arguments, each alone. */
	assert_int_equal(kvc_scatter(NULL, 0, 1, &l, ids, NULL), -EINVAL);
	assert_int_equal(kvc_scatter(r, 0, 1, NULL, ids, NULL), -EINVAL);
	assert_int_equal(kvc_scatter(r, 0, 1, &l, NULL, NULL), -EINVAL);
	assert_int_equal(kvc_scatter(r, 3, 2, &l, ids, NULL), -EINVAL);	/* past the request */
	assert_int_equal(kvc_scatter(r, 5, 0, &l, ids, NULL), -EINVAL);
	assert_int_equal(kvc_scatter(r, 0, 1, &l, far, NULL), -EINVAL);	/* id >= num_blocks */
	assert_int_equal(kvc_scatter(r, 0, 1, &l, neg, NULL), -EINVAL);
	bad = l;
	bad.size = 8;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.kind = 7;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.flags = 2;	/* unknown */
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.flags = KVC_LAYOUT_DEVICE;
	bad.device = -1;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.device = 1;	/* without KVC_LAYOUT_DEVICE */
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.resv32 = 1;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.resv[2] = 1;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	{	/* The options of the _v2 forms. */
		struct kvc_copy_opts co = { .size = sizeof(co) }, bo;

		assert_int_equal(kvc_scatter_v2(r, 0, 1, &l, ids, NULL), 0);
		assert_int_equal(kvc_scatter_v2(r, 0, 1, &l, ids, &co), 0);
		bo = co;
		bo.size = 8;
		assert_int_equal(kvc_scatter_v2(r, 0, 1, &l, ids, &bo), -EINVAL);
		bo = co;
		bo.flags = 1;
		assert_int_equal(kvc_scatter_v2(r, 0, 1, &l, ids, &bo), -EINVAL);
		bo = co;
		bo.resv[3] = 1;
		assert_int_equal(kvc_scatter_v2(r, 0, 1, &l, ids, &bo), -EINVAL);
		bo = co;
		bo.first_layer = m.layers;	/* past the model */
		assert_int_equal(kvc_gather_v2(r, 0, 1, &l, ids, &bo), -EINVAL);
		bo = co;
		bo.first_layer = 1;
		bo.layers = m.layers;		/* one too many */
		assert_int_equal(kvc_gather_v2(r, 0, 1, &l, ids, &bo), -EINVAL);
		bo.layers = m.layers - 1;	/* up to the last: fine */
		assert_int_equal(kvc_gather_v2(r, 0, 1, &l, ids, &bo), 0);
	}
	bad = l;
	bad.layers = 2;	/* not the model's */
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.num_blocks = 0;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.block_stride = e.half - 1;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.v = NULL;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	/* Nothing to do is fine. */
	assert_int_equal(kvc_scatter(r, 4, 0, &l, NULL, NULL), 0);
	/* Granted pages may be read back too. */
	assert_int_equal(kvc_scatter(r, 0, 4, &l, ids, NULL), 0);
	assert_int_equal(kvc_gather(r, 0, 4, &l, ids, NULL), 0);
	assert_int_equal(kvc_publish(r), 4);
	/* Published pages are shared: read-only. */
	assert_int_equal(kvc_scatter(r, 0, 1, &l, ids, NULL), -EPERM);
	assert_int_equal(kvc_gather(r, 0, 4, &l, ids, NULL), 0);
	/* A hit is read-only too. */
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, &r2), 0);
	assert_int_equal(kvc_lookup(r2), 4);
	assert_int_equal(kvc_scatter(r2, 1, 1, &l, ids, NULL), -EPERM);
	assert_int_equal(kvc_gather(r2, 1, 3, &l, ids, NULL), 0);
	kvc_req_free(r2);
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
}

/*
 * Layer by layer: a prompt scattered one layer per call (in reverse order)
 * and gathered with every range split (first layer alone, the rest in one
 * call) into another process's engine is the same, byte for byte, as the
 * one-call roundtrip: the range moves exactly its layers' K and V.
 */
static int fetch_by_layers_job(void *arg)
{
	struct job *j = arg;
	struct kvc_options o = { .size = sizeof(o), .socket_path = j->sock };
	struct kvc_copy_opts co = { .size = sizeof(co) };
	struct kvc_key keys[7];
	struct kvt_engine e;
	struct kvc_layout l;
	struct kvc_req *r;
	int64_t ids[7];
	uint32_t b, k;
	kvc_t *c;
	int rc = 0;

	if (kvc_open(&j->m, &o, &c) || kvt_engine_new(&e, &j->m, j->kind, 16, 64))
		return 1;
	l = kvt_engine_layout(&e, (void *const *)e.k, (void *const *)e.v);
	if (kvc_req_new(c, j->t, j->n, NULL, 0, &r) || kvc_lookup(r) != 7 ||
	    kvc_req_keys(r, keys, 7) != 7)
		return 2;
	for (b = 0; b < 7; b++)
		ids[b] = 15 - 2 * b;
	co.layers = 1;
	if (kvc_gather_v2(r, 0, 7, &l, ids, &co))
		return 3;
	/* Layer 0 only, so far: the other layers untouched. */
	for (b = 0; b < 7; b++)
		for (k = 0; k < j->m.layers; k++)
			if (kvt_engine_layer_has(&e, (uint64_t)ids[b], k, keys[b]) != (k == 0))
				return 4;
	co.first_layer = 1;
	co.layers = 0;	/* the rest */
	if (kvc_gather_v2(r, 0, 7, &l, ids, &co))
		return 5;
	for (b = 0; b < 7; b++)
		if (!kvt_engine_has(&e, (uint64_t)ids[b], keys[b]))
			rc = 6;
	for (b = 0; b < 16; b++)
		if (b % 2 == 0 && !kvt_engine_untouched(&e, b))
			rc = 7;
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
	return rc;
}

static void test_layer_ranges(void **state)
{
	const struct kvt_daemon *d = *state;
	struct kvc_model m = model_a();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	struct kvc_copy_opts co = { .size = sizeof(co), .layers = 1 };
	struct kvc_key keys[7];
	uint32_t t[7 * BT];
	struct job j = { d->sock, m, t, 7 * BT, KVC_LAYOUT_FLASH };
	struct kvt_engine e;
	struct kvc_layout l;
	struct kvc_req *r;
	int64_t ids[7];
	uint32_t b;
	kvc_t *c;
	int i;

	kvt_tokens(t, 7 * BT, 0, 320);
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(kvt_engine_new(&e, &m, KVC_LAYOUT_KV, 8, 0), 0);
	l = kvt_engine_layout(&e, (void *const *)e.k, (void *const *)e.v);
	assert_int_equal(kvc_req_new(c, t, 7 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), 7);
	assert_int_equal(kvc_req_keys(r, keys, 7), 7);
	for (b = 0; b < 7; b++) {
		ids[b] = 7 - b;
		kvt_engine_put(&e, (uint64_t)ids[b], keys[b]);
	}
	for (i = (int)m.layers - 1; i >= 0; i--) {
		co.first_layer = (uint32_t)i;
		assert_int_equal(kvc_scatter_v2(r, 0, 7, &l, ids, &co), 0);
	}
	assert_int_equal(kvc_publish(r), 7);
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
	assert_int_equal(kvt_wait(kvt_fork(fetch_by_layers_job, &j)), 0);
}

/*
 * No GPU here (or a build without CUDA): a host pool asked to copy to or
 * from tensors on a GPU, or to prepare one, says it cannot, and
 * kvc_gpu_status says why in words; the CPU path is unaffected.
 */
static void test_gpu_engine_without_a_gpu(void **state)
{
	const struct kvt_daemon *d = *state;
	struct kvc_model m = model_a();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	struct kvc_gpu_status st = { .size = sizeof(st) };
	const char *why = NULL;
	uint32_t t[2 * BT];
	struct kvt_engine e;
	struct kvc_layout l, dl;
	struct kvc_key keys[2];
	struct kvc_req *r;
	int64_t ids[2] = { 0, 1 };
	kvc_t *c;

	(void)state;
	if (!kvk_cuda_load(&why)) {
		print_message("[  SKIP    ] a CUDA driver is here: tests/gpu/hostpool.c runs this path\n");
		skip();
	}
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(kvc_gpu_status(c, &st), 0);
	assert_int_equal(st.state, KVC_GPU_NONE);
	assert_int_equal(st.device, -1);
	assert_int_equal(st.chunks, 1);		/* a 1 MiB pool: one chunk */
	st.size = 4;
	assert_int_equal(kvc_gpu_status(c, &st), -EINVAL);
	assert_int_equal(kvc_gpu_status(NULL, &st), -EINVAL);
	assert_int_equal(kvc_gpu_prepare(NULL, 0, 0), -EINVAL);
	assert_int_equal(kvc_gpu_prepare(c, -1, 0), -EINVAL);
	assert_int_equal(kvc_gpu_prepare(c, 0, 2), -EINVAL);
	assert_int_equal(kvc_gpu_prepare(c, 0, KVC_GPU_WAIT), -ENOTSUP);
	st.size = sizeof(st);
	assert_int_equal(kvc_gpu_status(c, &st), 0);
	assert_int_equal(st.state, -ENOTSUP);
	assert_int_equal(st.chunks_registered, 0);
	if (strcmp(st.why, why))
		fail_msg("kvc_gpu_status says \"%s\", want \"%s\"", st.why, why);

	assert_int_equal(kvt_engine_new(&e, &m, KVC_LAYOUT_FLASH, 2, 0), 0);
	l = kvt_engine_layout(&e, (void *const *)e.k, (void *const *)e.v);
	dl = l;
	dl.flags = KVC_LAYOUT_DEVICE;
	kvt_tokens(t, 2 * BT, 0, 330);
	assert_int_equal(kvc_req_new(c, t, 2 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), 2);
	assert_int_equal(kvc_scatter(r, 0, 2, &dl, ids, NULL), -ENOTSUP);
	assert_int_equal(kvc_gather(r, 0, 2, &dl, ids, NULL), -ENOTSUP);
	assert_int_equal(kvc_req_keys(r, keys, 2), 2);
	kvt_engine_put(&e, 0, keys[0]);
	kvt_engine_put(&e, 1, keys[1]);
	assert_int_equal(kvc_scatter(r, 0, 2, &l, ids, NULL), 0);	/* the CPU way */
	assert_int_equal(kvc_publish(r), 2);
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
}

/*
 * Where no cuda pool can be had (no driver here, or a build without CUDA),
 * `kvcached --pool cuda` exits 1 at once, saying exactly why and what to
 * use instead, and never listens.
 */
static void test_cuda_pool_refused_clearly(void **state)
{
	char sock[64], out[2048], want[400];
	const char *args[] = { "--foreground", "--socket", sock, "--pool", "cuda",
			       "--pool-size", "4M", "--page-size", "4K", NULL };
	const char *why = NULL;

	(void)state;
	if (!kvk_cuda_load(&why)) {
		print_message("[  SKIP    ] a CUDA driver is here: tests/gpu/pool.c runs the cuda pool\n");
		skip();
	}
	snprintf(sock, sizeof(sock), "/tmp/kvt-cuda-%d.sock", (int)getpid());
	snprintf(want, sizeof(want), "pool cuda: %s", why);
	assert_int_equal(kvt_run(NULL, args, out, sizeof(out)), 1);
	if (!strstr(out, want) || !strstr(out, "use --pool host"))
		fail_msg("kvcached --pool cuda said \"%s\", want \"%s ...; use --pool host\"", out, want);
	assert_false(kvproto_can_connect(sock));
}

static int raw_connect(const char *path)
{
	int fd = kvt_raw_connect(path);

	assert_true(fd >= 0);
	return fd;
}

static void send_frame(int fd, uint16_t type, const void *p, uint32_t len)
{
	struct kvproto_hdr h = { KVPROTO_MAGIC, type, 0, len, 7 };

	assert_int_equal(write(fd, &h, sizeof(h)), sizeof(h));
	if (len)
		assert_int_equal(write(fd, p, len), (ssize_t)len);
}

/* Read until the daemon closes; the ERROR's err (0 if none came). */
static int32_t error_then_close(int fd)
{
	uint8_t buf[4096];
	struct kvproto_hdr h;
	struct kvproto_error e = { 0, 0 };
	size_t got = 0;
	ssize_t n;

	while (got < sizeof(buf) && (n = read(fd, buf + got, sizeof(buf) - got)) > 0)
		got += (size_t)n;
	close(fd);
	/* Skip a HELLO_R if one came first. */
	memcpy(&h, buf, sizeof(h));
	if (h.type == KVPROTO_HELLO_R && got >= sizeof(h) + h.len) {
		memmove(buf, buf + sizeof(h) + h.len, got - sizeof(h) - h.len);
		got -= sizeof(h) + h.len;
		memcpy(&h, buf, sizeof(h));
	}
	if (got >= sizeof(h) + sizeof(e) && h.type == KVPROTO_ERROR)
		memcpy(&e, buf + sizeof(h), sizeof(e));
	return e.err;
}

/* POOL is for a cuda pool's clients only; anything else is refused and
 * the connection closed, the daemon serving on. */
static void test_pool_frame_on_a_host_pool(void **state)
{
	const struct kvt_daemon *d = *state;
	struct kvproto_hello hi = { .version = KVPROTO_VERSION, .dtype_bytes = 2, .layers = 1,
				    .kv_heads = 2, .head_dim = 32, .block_tokens = BT,
				    .pos_kind = 1, .model = "kvt-tiny" };
	struct kvproto_pool q = { KVPROTO_VERSION, 0 };
	uint32_t t[2 * BT];
	kvc_t *c;
	int fd;

	/* Before HELLO. */
	fd = raw_connect(d->sock);
	send_frame(fd, KVPROTO_POOL, &q, sizeof(q));
	assert_int_equal(error_then_close(fd), -EPROTO);
	/* After HELLO, to a host pool. */
	fd = raw_connect(d->sock);
	send_frame(fd, KVPROTO_HELLO, &hi, sizeof(hi));
	send_frame(fd, KVPROTO_POOL, &q, sizeof(q));
	assert_int_equal(error_then_close(fd), -EPROTO);
	/* Malformed (flags set). */
	fd = raw_connect(d->sock);
	send_frame(fd, KVPROTO_HELLO, &hi, sizeof(hi));
	q.flags = 1;
	send_frame(fd, KVPROTO_POOL, &q, sizeof(q));
	assert_int_equal(error_then_close(fd), -EBADMSG);
	/* The daemon serves on. */
	c = kvt_open(d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 2 * BT, 0, 320);
	assert_int_equal(kvt_put(c, t, 2 * BT, NULL), 0);
	assert_int_equal(kvt_get(c, t, 2 * BT), 2);
	kvc_close(c);
}

static int setup(void **state)
{
	return kvt_setup_args(state, daemon_args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scatter_publish_gather_elsewhere),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_layer_ranges),
		cmocka_unit_test(test_gpu_engine_without_a_gpu),
		cmocka_unit_test(test_cuda_pool_refused_clearly),
		cmocka_unit_test(test_pool_frame_on_a_host_pool),
	};

	return cmocka_run_group_tests_name("integration/kernels", tests, setup, kvt_teardown);
}
