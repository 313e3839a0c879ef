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
	bad.flags = 1;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
	bad = l;
	bad.resv[3] = 1;
	assert_int_equal(kvc_scatter(r, 0, 1, &bad, ids, NULL), -EINVAL);
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
		cmocka_unit_test(test_cuda_pool_refused_clearly),
		cmocka_unit_test(test_pool_frame_on_a_host_pool),
	};

	return cmocka_run_group_tests_name("integration/kernels", tests, setup, kvt_teardown);
}
