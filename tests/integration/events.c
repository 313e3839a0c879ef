// SPDX-License-Identifier: MIT
/*
 * events.c - KV events from the real daemon, with libzmq on the test's
 * side (tests/python/test_kv_events.py covers the format and the tiers in
 * depth; this runs in every build, the sanitizer builds included, so the
 * daemon's ZMQ side runs under ASan and TSan too).
 *
 * not_loaded: without --kv-events the daemon never maps libzmq (nor any
 *   msgpack library); with it, libzmq is mapped and msgpack still is not
 *   (msgpack-c's packer is header-only).
 * publish_replay: a prompt published by a real client arrives as one
 *   BlockStored on the PUB socket, in the schema vLLM's decoder takes;
 *   the replay socket resends the same bytes under the same sequence
 *   number, then the end marker; a malformed replay request is answered
 *   with the end marker and counted, and the daemon goes on serving and
 *   stops cleanly.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "../lib/harness.h"
#include "../lib/kvevents.h"
#include "../../shm/segment.h"

static bool maps_has(pid_t pid, const char *what)
{
	char path[64], line[512];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	assert_non_null(f);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, what) != NULL;
	fclose(f);
	return found;
}

static void test_not_loaded(void **state)
{
	struct kvt_daemon d;
	char ev[128];
	const char *args[] = { "--kv-events", ev, NULL };

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	assert_false(maps_has(d.pid, "libzmq"));
	assert_false(maps_has(d.pid, "msgpack"));
	assert_int_equal(kvt_daemon_stop(&d), 0);

	snprintf(ev, sizeof(ev), "ipc:///tmp/kvt-ev-%d", (int)getpid());
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	assert_true(maps_has(d.pid, "libzmq"));
	assert_false(maps_has(d.pid, "msgpack"));
	assert_int_equal(access(ev + 6, F_OK), 0);	/* the endpoint's file */
	assert_int_equal(kvt_daemon_stop(&d), 0);
	/* A clean stop removes the ipc:// endpoint file it bound. */
	assert_int_equal(access(ev + 6, F_OK), -1);
}

/* Receive a multipart message of up to 4 frames, waiting at most ms. */
static int recv_parts(void *s, zmq_msg_t *m, int max, int ms)
{
	zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
	int n = 0;

	if (zmq_poll(&it, 1, ms) <= 0)
		return 0;
	do {
		assert_true(n < max);
		zmq_msg_init(&m[n]);
		assert_true(zmq_msg_recv(&m[n], s, 0) >= 0);
	} while (zmq_msg_more(&m[n++]));
	return n;
}

static uint64_t be64(const zmq_msg_t *m)
{
	const uint8_t *p = zmq_msg_data((zmq_msg_t *)m);
	uint64_t v = 0;
	int i;

	assert_int_equal(zmq_msg_size((zmq_msg_t *)m), 8);
	for (i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static void test_publish_replay(void **state)
{
	struct kvt_daemon d;
	char ev[128], rp[128], topic[256];
	const char *args[] = { "--kv-events", ev, "--kv-events-replay", rp,
			       "--kv-events-topic", "t@{model}", NULL };
	void *ctx = zmq_ctx_new(), *sub = zmq_socket(ctx, ZMQ_SUB), *req;
	struct kvc_key k[3];
	uint32_t t[48];
	struct kve_batch b;
	const char *why = "?";
	zmq_msg_t m[4], r[4];
	kvc_t *c;
	int n, i, tries, zero = 0;
	uint8_t start[8] = { 0 };

	(void)state;
	snprintf(ev, sizeof(ev), "ipc:///tmp/kvt-ev-%d", (int)getpid());
	snprintf(rp, sizeof(rp), "ipc:///tmp/kvt-rp-%d", (int)getpid());
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	assert_int_equal(zmq_connect(sub, ev), 0);
	assert_int_equal(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 48, 0, 5);
	assert_int_equal(kvc_keys(c, t, 48, NULL, 0, k, 3), 3);
	/* Publish until the subscription has reached the daemon (a late
	 * joiner misses what came before: ZMQ's PUB/SUB; replay covers it). */
	for (n = 0, tries = 0; !n && tries < 100; tries++) {
		t[0] = (uint32_t)tries;	/* a new prompt each time */
		kvc_keys(c, t, 48, NULL, 0, k, 3);
		assert_true(kvt_put(c, t, 48, NULL) >= 0);
		n = recv_parts(sub, m, 4, 100);
	}
	assert_int_equal(n, 3);
	snprintf(topic, sizeof(topic), "t@kvt-tiny");
	assert_int_equal(zmq_msg_size(&m[0]), strlen(topic));
	assert_memory_equal(zmq_msg_data(&m[0]), topic, strlen(topic));
	if (kve_decode(zmq_msg_data(&m[2]), zmq_msg_size(&m[2]), &b, &why))
		fail_msg("live batch: %s", why);
	assert_int_equal(b.n, 1);
	assert_int_equal(b.ev[0].type, KVE_STORED);
	assert_int_equal(b.ev[0].n, 3);
	for (i = 0; i < 3; i++)
		assert_int_equal(b.ev[0].hash[i].lo, k[i].lo);
	assert_false(b.ev[0].has_parent);
	assert_memory_equal(b.ev[0].tok, t, sizeof(t));
	assert_string_equal(b.ev[0].medium, "CPU");
	kve_free(&b);

	/* Replay from 0 on a DEALER (a REQ socket takes one reply per
	 * request): the same batch, byte for byte, then the end marker. */
	req = zmq_socket(ctx, ZMQ_DEALER);
	assert_int_equal(zmq_connect(req, rp), 0);
	assert_int_equal(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
	assert_int_equal(zmq_send(req, start, 8, 0), 8);
	tries = 0;
	for (;;) {
		n = recv_parts(req, r, 4, 10000);
		assert_int_equal(n, 3);
		assert_int_equal(zmq_msg_size(&r[0]), 0);
		if (be64(&r[1]) == UINT64_MAX) {
			assert_int_equal(zmq_msg_size(&r[2]), 0);
			break;
		}
		if (be64(&r[1]) == be64(&m[1])) {
			assert_int_equal(zmq_msg_size(&r[2]), zmq_msg_size(&m[2]));
			assert_memory_equal(zmq_msg_data(&r[2]), zmq_msg_data(&m[2]),
					    zmq_msg_size(&m[2]));
			tries = -1;
		}
		for (i = 0; i < 3; i++)
			zmq_msg_close(&r[i]);
	}
	for (i = 0; i < 3; i++)
		zmq_msg_close(&r[i]);
	assert_int_equal(tries, -1);	/* the live batch was among them */
	for (i = 0; i < 3; i++)
		zmq_msg_close(&m[i]);

	/* A malformed request: the end marker, counted; the daemon goes on. */
	assert_int_equal(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
	assert_int_equal(zmq_send(req, start, 7, 0), 7);
	assert_int_equal(recv_parts(req, r, 4, 10000), 3);
	assert_int_equal(be64(&r[1]), UINT64_MAX);
	for (i = 0; i < 3; i++)
		zmq_msg_close(&r[i]);
	assert_true(kvt_put(c, t, 48, NULL) >= 0);
	kvc_close(c);
	zmq_setsockopt(req, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_close(req);
	zmq_close(sub);
	zmq_ctx_term(ctx);
	assert_true(kvt_log_has(&d, "kv events: replay request refused"));
	assert_int_equal(kvt_daemon_stop(&d), 0);
	/* Both endpoint files went with the clean stop. */
	assert_int_equal(access(ev + 6, F_OK), -1);
	assert_int_equal(access(rp + 6, F_OK), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_not_loaded),
		cmocka_unit_test(test_publish_replay),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
