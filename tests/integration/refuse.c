// SPDX-License-Identifier: MIT
/*
 * refuse.c - what kvcached refuses, and that refusing costs nobody else:
 * a geometry that does not fit, a peer it does not trust, garbage and
 * lies on the socket (dropped, daemon still serving), a new client never
 * taken for the exited one whose row it reuses, and a bad config
 * file or flag (non-zero exit, message naming the problem).
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
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/mman.h>

#include "../lib/harness.h"
#include "../../shm/index.h"
#include "../../shm/key.h"
#include "../../shm/ledger.h"
#include "../../shm/page.h"
#include "../../shm/proto.h"
#include "../../shm/stats.h"
#include "../../libclient/observe.h"

#define BT 16

/* LRU eviction: these tests watch pages that were used go once they may
 * (a released pin, a reclaimed row) under a flood of one-off prompts,
 * which S3-FIFO, the default, would by design not let displace them. */
static int setup(void **state)
{
	const char *args[] = { "--socket-mode", "0666", "--eviction", "lru", NULL };

	return kvt_setup_args(state, args);
}

/* The daemon still serves: publish and hit a fresh prompt. */
static void assert_serving(const struct kvt_daemon *d, uint32_t seed)
{
	kvc_t *c = kvt_open(d, NULL);
	uint32_t t[3 * BT];
	int cached = 0;

	assert_non_null(c);
	kvt_tokens(t, 3 * BT, 0, seed);
	assert_int_equal(kvt_put(c, t, 3 * BT, &cached), 0);
	assert_int_equal(cached, 3);
	assert_int_equal(kvt_get(c, t, 3 * BT), 3);
	kvc_close(c);
}

static void test_geometry_that_does_not_fit(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model m = kvt_model();
	char err[512];
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock, .errbuf = err,
				 .errbuf_len = sizeof(err) };
	kvc_t *c = NULL;

	m.layers = 2;	/* 8 KiB pages into a 4 KiB pool */
	assert_int_equal(kvc_open(&m, &o, &c), -EMEDIUMTYPE);
	assert_null(c);
	assert_non_null(strstr(err, "needs 8192-byte pages"));
	assert_non_null(strstr(err, "4096 bytes"));
	m = kvt_model();
	m.block_tokens = 32;
	assert_int_equal(kvc_open(&m, &o, &c), -EMEDIUMTYPE);
	assert_non_null(strstr(err, "32-token blocks"));
	/* A smaller page fits (it wastes part of each slot). */
	m = kvt_model();
	m.head_dim = 16;
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(kvc_page_bytes(c), 2048);
	kvc_close(c);
	assert_serving(d, 31);
}

static void test_untrusted_peer(void **state)
{
	struct kvt_daemon *d = *state, other;
	const char *args[] = { "--allow-users", "65534", "--socket-mode", "0666", NULL };
	struct kvc_model m = kvt_model();
	char err[512];
	struct kvc_options o = { .size = sizeof(o), .errbuf = err, .errbuf_len = sizeof(err) };
	kvc_t *c = NULL;
	pid_t p;

	/* A daemon that trusts only uid 65534 refuses us. */
	if (getuid() != 65534) {
		assert_int_equal(kvt_daemon_start(&other, args), 0);
		o.socket_path = other.sock;
		assert_int_equal(kvc_open(&m, &o, &c), -EACCES);
		assert_non_null(strstr(err, "does not trust uid"));
		assert_true(kvt_log_has(&other, "is not in allow-users"));
		assert_int_equal(kvt_daemon_stop(&other), 0);
	}
	/* The default daemon trusts its own user only: a process that
	 * dropped to nobody is refused (needs root to drop). */
	if (geteuid() != 0) {
		print_message("skip part: not root, cannot run a client as another user\n");
		return;
	}
	p = fork();
	if (!p) {
		o.socket_path = d->sock;
		if (setgid(65534) || setuid(65534))
			_exit(9);
		_exit(kvc_open(&m, &o, &c) == -EACCES ? 0 : 1);
	}
	assert_int_equal(kvt_wait(p), 0);
	assert_serving(d, 32);
}

static int raw_connect(const char *path)
{
	int fd = kvt_raw_connect(path);

	assert_true(fd >= 0);
	return fd;
}

/* Read until the daemon closes; true if it did (with or without ERROR). */
static bool closed_by_daemon(int fd, int32_t *err)
{
	uint8_t buf[4096];
	size_t got = 0;
	ssize_t n;

	*err = 0;
	while ((n = read(fd, buf + got, sizeof(buf) - got)) > 0)
		got += (size_t)n;
	if (got >= sizeof(struct kvproto_hdr) + sizeof(struct kvproto_error)) {
		struct kvproto_hdr h;
		struct kvproto_error e;

		memcpy(&h, buf, sizeof(h));
		memcpy(&e, buf + sizeof(h), sizeof(e));
		if (h.type == KVPROTO_ERROR)
			*err = e.err;
	}
	close(fd);
	return n == 0;
}

static void send_frame(int fd, uint16_t type, const void *p, uint32_t len)
{
	assert_int_equal(kvt_send_frame(fd, type, p, len), 0);
}

static void hello(int fd)
{
	struct kvproto_hello hi = { .version = KVPROTO_VERSION, .dtype_bytes = 2, .layers = 1,
				    .kv_heads = 2, .head_dim = 32, .block_tokens = BT,
				    .pos_kind = 1, .model = "kvt-tiny" };
	struct kvproto_hdr h;

	send_frame(fd, KVPROTO_HELLO, &hi, sizeof(hi));
	assert_int_equal(read(fd, &h, sizeof(h)), sizeof(h));
	assert_int_equal(h.type, KVPROTO_HELLO_R);
	{
		char rest[sizeof(struct kvproto_hello_r)];

		assert_int_equal(read(fd, rest, h.len), (ssize_t)h.len);
	}
}

static void test_garbage_and_lies_on_the_socket(void **state)
{
	struct kvt_daemon *d = *state;
	kvc_t *bystander = kvt_open(d, NULL);
	uint8_t junk[512];
	int32_t err;
	int fd, i;

	assert_non_null(bystander);
	/* Random bytes before HELLO. */
	for (i = 0; i < (int)sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 131 + 7);
	fd = raw_connect(d->sock);
	assert_int_equal(write(fd, junk, sizeof(junk)), sizeof(junk));
	assert_true(closed_by_daemon(fd, &err));
	assert_int_equal(err, -EBADMSG);

	/* A frame claiming a 1 GiB payload. */
	fd = raw_connect(d->sock);
	{
		struct kvproto_hdr h = { KVPROTO_MAGIC, KVPROTO_HELLO, 0, 1u << 30, 1 };

		assert_int_equal(write(fd, &h, sizeof(h)), sizeof(h));
	}
	assert_true(closed_by_daemon(fd, &err));
	assert_int_equal(err, -EBADMSG);

	/* ALLOC before HELLO. */
	fd = raw_connect(d->sock);
	{
		struct kvproto_alloc a = { 1, 0 };

		send_frame(fd, KVPROTO_ALLOC, &a, sizeof(a));
	}
	assert_true(closed_by_daemon(fd, &err));
	assert_int_equal(err, -EPROTO);

	/* After HELLO: PUBLISH of a page it was never given. */
	fd = raw_connect(d->sock);
	hello(fd);
	{
		uint8_t msg[sizeof(struct kvproto_count) + sizeof(struct kvproto_pub) + BT * 4];
		struct kvproto_count cnt = { 1, 0 };
		struct kvproto_pub pub = { .page = 3, .gen = 1, .key = { 1, 2 } };

		memset(msg, 0, sizeof(msg));
		memcpy(msg, &cnt, sizeof(cnt));
		memcpy(msg + sizeof(cnt), &pub, sizeof(pub));
		send_frame(fd, KVPROTO_PUBLISH, msg, sizeof(msg));
	}
	assert_true(closed_by_daemon(fd, &err));
	assert_int_equal(err, -EINVAL);

	/* After HELLO: ALLOC a page, then FREE it twice in one message. A
	 * separate process, which then exits: its page must come back. */
	{
		pid_t liar = fork();

		if (!liar) {
			struct kvproto_alloc a = { 1, 0 };
			struct kvproto_hdr h;
			uint8_t rep[sizeof(struct kvproto_count) + sizeof(struct kvproto_pg)];
			uint8_t msg[sizeof(struct kvproto_count) + 2 * sizeof(struct kvproto_pg)];
			struct kvproto_count cnt = { 2, 0 };

			fd = raw_connect(d->sock);
			hello(fd);
			send_frame(fd, KVPROTO_ALLOC, &a, sizeof(a));
			if (read(fd, &h, sizeof(h)) != sizeof(h) || h.type != KVPROTO_ALLOC_R ||
			    h.len != sizeof(rep) || read(fd, rep, sizeof(rep)) != sizeof(rep))
				_exit(2);
			memcpy(msg, &cnt, sizeof(cnt));
			memcpy(msg + sizeof(cnt), rep + sizeof(cnt), sizeof(struct kvproto_pg));
			memcpy(msg + sizeof(cnt) + sizeof(struct kvproto_pg), rep + sizeof(cnt),
			       sizeof(struct kvproto_pg));
			send_frame(fd, KVPROTO_FREE, msg, sizeof(msg));
			_exit(closed_by_daemon(fd, &err) && err == -EINVAL ? 0 : 3);
		}
		assert_int_equal(kvt_wait(liar), 0);
	}

	/* Oversized count. */
	fd = raw_connect(d->sock);
	hello(fd);
	{
		struct kvproto_alloc a = { KVPROTO_MAX_COUNT + 1, 0 };

		send_frame(fd, KVPROTO_ALLOC, &a, sizeof(a));
	}
	assert_true(closed_by_daemon(fd, &err));
	assert_int_equal(err, -EBADMSG);

	/* Nobody else noticed, and nothing leaked. */
	{
		struct kvc_stats s;
		int k;

		for (k = 0; k < 200; k++) {
			assert_int_equal(kvc_stats(bystander, &s), 0);
			if (!s.pages_writing)
				break;
			usleep(10000);
		}
		assert_int_equal(s.pages_writing, 0);
	}
	assert_serving(d, 33);
	assert_true(kvt_log_has(d, "does not hold WRITING"));
	kvc_close(bystander);
}

/* HELLO by hand, keeping the descriptors: [segment, pool, ledger]. */
static void hello_fds(int fd, int fds[3], struct kvproto_hello_r *hr)
{
	assert_int_equal(kvt_raw_hello(fd, fds, hr), 0);
}

/*
 * Regression: the daemon used to bound its ledger scans by the nslots in
 * the ledger header, which the client can write. A client that scribbles
 * over its whole ledger (header, slots, access ring) must not take the
 * daemon down while eviction scans it and the tick drains its ring.
 */
static void test_client_scribbles_its_ledger(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvproto_hello_r hr;
	struct kvshm_ledger *l;
	int fds[3], fd = raw_connect(d->sock), i;
	uint32_t k;

	hello_fds(fd, fds, &hr);
	l = mmap(NULL, hr.ledger_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
	assert_true(l != MAP_FAILED);
	l->nslots = UINT32_MAX;
	l->magic = 0;
	for (k = 0; k < hr.nslots; k++)
		atomic_store(&l->slot[k], k & 1 ? UINT64_MAX : kvshm_slot_pack(k * 7919u, k));
	for (k = 0; k < KVSHM_RING; k++)
		atomic_store(&l->ring[k], UINT32_MAX - k);
	atomic_store(&l->ring_head, UINT64_MAX - 3);
	/* Growing the ledger past its sealed size is refused by the kernel. */
	assert_int_not_equal(ftruncate(fds[2], (off_t)hr.ledger_bytes * 2), 0);
	assert_int_not_equal(ftruncate(fds[2], 0), 0);

	assert_int_equal(kvt_flood(d, 80, 7000), 0);
	assert_serving(d, 35);
	for (i = 0; i < 3; i++)
		close(fds[i]);
	munmap(l, hr.ledger_bytes);
	close(fd);
	assert_serving(d, 36);
}

/* The daemon's clients_lingering gauge, read as an observer. */
static uint64_t lingering(const struct kvt_daemon *d)
{
	struct kvshm_snap sn;
	struct kvobs o;
	char err[256];
	uint64_t v;

	assert_int_equal(kvobs_attach(d->sock, &o, err, sizeof(err)), 0);
	assert_int_equal(kvshm_snap_take(o.h, &sn), 0);
	v = sn.v[KVSHM_STAT_ID(clients_lingering)];
	kvshm_snap_free(&sn);
	kvobs_detach(&o);
	return v;
}

struct liar {
	const struct kvt_daemon *d;
	uint32_t tokens[4 * BT];
	int ready[2];
};

/*
 * A raw client that pins a published prompt through its own ledger (as
 * libkvclient does), takes two pages WRITING, then breaks the protocol and
 * is disconnected, but lives on.
 */
static int pin_then_misbehave(void *arg)
{
	struct liar *lr = arg;
	struct kvproto_hello_r hr;
	struct kvproto_hello hi = { .version = KVPROTO_VERSION, .dtype_bytes = 2, .layers = 1,
				    .kv_heads = 2, .head_dim = 32, .block_tokens = BT,
				    .pos_kind = 1, .model = "kvt-tiny" };
	const struct kvshm_header *h;
	struct kvshm_ledger *l;
	struct kvshm_ns ns;
	struct kvshm_key keys[4], parent;
	struct kvproto_alloc a = { 2, 0 };
	struct kvproto_hdr rh;
	uint8_t rep[64];
	int fds[3], fd = raw_connect(lr->d->sock), i;
	int32_t err;
	char b = 'r';

	hello_fds(fd, fds, &hr);
	h = mmap(NULL, hr.segment_bytes, PROT_READ, MAP_SHARED, fds[0], 0);
	l = mmap(NULL, hr.ledger_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
	if (h == MAP_FAILED || l == MAP_FAILED || kvproto_hello_ns(&hi, &ns))
		return 2;
	parent = kvshm_key_root(ns.id, NULL, 0);
	kvshm_key_chain(parent, parent, kvshm_key_extra(NULL, 0), lr->tokens, 4 * BT, BT, keys);
	for (i = 0; i < 4; i++) {
		uint32_t page = kvshm_index_find(h, keys[i]), gen;

		if (!kvshm_page_verify(h, page, hr.ns_id, keys[i], parent, lr->tokens + i * BT,
				       &gen) ||
		    !kvshm_ledger_pin(l, (uint32_t)i, h, page, gen))
			return 3;
		parent = keys[i];
	}
	send_frame(fd, KVPROTO_ALLOC, &a, sizeof(a));
	if (read(fd, &rh, sizeof(rh)) != sizeof(rh) || rh.type != KVPROTO_ALLOC_R ||
	    rh.len > sizeof(rep) || read(fd, rep, rh.len) != (ssize_t)rh.len)
		return 4;
	send_frame(fd, 0x7777, NULL, 0);	/* not a request: dropped */
	if (!closed_by_daemon(fd, &err) || err != -EBADMSG)
		return 5;
	if (write(lr->ready[1], &b, 1) != 1)
		return 6;
	pause();	/* alive, pins in place, until killed */
	return 0;
}

/*
 * Regression (review finding): a client the daemon disconnected used to
 * lose its pins at once although its process, and maybe a thread reading
 * a pinned page, lived on; eviction then reused the pages under it. Now
 * the pins (and its writing pages) hold until the process exits.
 */
static void test_dropped_live_client_keeps_its_pins(void **state)
{
	struct kvt_daemon *d = *state;
	struct liar lr = { .d = d };
	kvc_t *c = kvt_open(d, NULL);
	struct kvc_stats s;
	uint64_t before;
	pid_t p;
	char b;
	int i;

	assert_non_null(c);
	before = lingering(d);
	kvt_tokens(lr.tokens, 4 * BT, 0, 4545);
	assert_int_equal(kvt_put(c, lr.tokens, 4 * BT, NULL), 0);
	assert_int_equal(pipe(lr.ready), 0);
	p = kvt_fork(pin_then_misbehave, &lr);
	assert_int_equal(read(lr.ready[0], &b, 1), 1);
	assert_true(kvt_log_has(d, "while the process lives on"));
	/* Operators see it too. (Earlier raw connections of this very test
	 * process linger as well: it lives on. Hence a difference.) */
	assert_int_equal(lingering(d), before + 1);
	assert_int_equal(kvc_stats(c, &s), 0);
	assert_int_equal(s.pages_writing, 2);	/* still the liar's */

	/* Pressure: the pinned prompt must survive it. */
	assert_int_equal(kvt_flood(d, 80, 7000), 0);
	assert_int_equal(kvt_get(c, lr.tokens, 4 * BT), 4);

	/* Once the process is gone, everything it held is released. */
	kill(p, SIGKILL);
	assert_int_equal(kvt_wait(p), 128 + SIGKILL);
	for (i = 0; i < 500; i++) {
		assert_int_equal(kvc_stats(c, &s), 0);
		if (!s.pages_writing)
			break;
		usleep(10000);
	}
	assert_int_equal(s.pages_writing, 0);
	assert_true(kvt_log_has(d, "process exited"));
	assert_int_equal(lingering(d), before);
	assert_int_equal(kvt_flood(d, 80, 7000), 0);
	assert_true(kvt_get(c, lr.tokens, 4 * BT) < 4);	/* evictable again */
	close(lr.ready[0]);
	close(lr.ready[1]);
	kvc_close(c);
}


/* The process behind the row the next test reuses: attaches (raw HELLO),
 * then hangs up and exits, each step when the parent says. */
struct hangup {
	const struct kvt_daemon *d;
	int go[2], done[2];
};

static int attach_hang_up_exit(void *arg)
{
	struct hangup *h = arg;
	struct kvproto_hello_r hr;
	int fds[3] = { -1, -1, -1 };
	int fd = kvt_raw_connect(h->d->sock);
	char b;

	if (fd < 0 || kvt_raw_hello(fd, fds, &hr))
		return 1;
	if (write(h->done[1], "a", 1) != 1 || read(h->go[0], &b, 1) != 1)
		return 2;
	close(fd);			/* holds nothing: the row ends here */
	if (write(h->done[1], "c", 1) != 1 || read(h->go[0], &b, 1) != 1)
		return 3;
	return 0;			/* and its pidfd turns readable here */
}

/* Is pid stopped (state T)? */
static bool stopped(pid_t pid)
{
	return kvt_proc_state(pid) == 'T';
}

/*
 * Regression: a client row ended and taken again earlier in one epoll
 * batch got the old process's pidfd event later in the same batch, and
 * the daemon dropped the new, live client as exited ("gone before HELLO:
 * process exited"; seen as kvc_open -ENOTCONN under load). Made certain
 * here by stopping the daemon while, in this order, A hangs up (its row
 * ends on that event), B connects (the row is free again: B takes it) and
 * A exits (its pidfd event comes last). B must then be served.
 */
static void row_taken_again_once(void)
{
	struct kvt_daemon own = { 0 };
	struct hangup h;
	struct kvproto_hello_r hr;
	int fds[3] = { -1, -1, -1 };
	int b, i;
	pid_t a;
	char c;

	assert_int_equal(kvt_daemon_start(&own, NULL), 0);
	h.d = &own;
	assert_int_equal(pipe(h.go), 0);
	assert_int_equal(pipe(h.done), 0);
	a = kvt_fork(attach_hang_up_exit, &h);
	assert_int_equal(read(h.done[0], &c, 1), 1);
	assert_int_equal(c, 'a');

	assert_int_equal(kill(own.pid, SIGSTOP), 0);
	for (i = 0; i < 1000 && !stopped(own.pid); i++)
		usleep(1000);
	assert_true(stopped(own.pid));
	assert_int_equal(write(h.go[1], "x", 1), 1);	/* A hangs up */
	assert_int_equal(read(h.done[0], &c, 1), 1);
	assert_int_equal(c, 'c');
	b = kvt_raw_connect(own.sock);			/* B queues on the listener */
	assert_true(b >= 0);
	assert_int_equal(write(h.go[1], "x", 1), 1);	/* A exits */
	assert_int_equal(kvt_wait(a), 0);
	assert_int_equal(kill(own.pid, SIGCONT), 0);

	/* Usually one batch: A's hang-up, the accept of B into A's row, A's
	 * pidfd. B must be served. */
	assert_int_equal(kvt_raw_hello(b, fds, &hr), 0);
	for (i = 0; i < 3; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	close(b);
	close(h.go[0]);
	close(h.go[1]);
	close(h.done[0]);
	close(h.done[1]);
	assert_int_equal(kvt_daemon_stop(&own), 0);
}

/* The kernel does not promise that order within a batch (without the fix
 * about 2 runs in 3 fail): eight rounds make a miss all but certain. */
static void test_row_taken_again_before_the_old_pidfd_event(void **state)
{
	(void)state;
	for (int round = 0; round < 8; round++)
		row_taken_again_once();
}

/*
 * Regression (review finding): namespace rows were never reused, so 64
 * short-lived model names blocked every new model until a restart. A row
 * whose namespace has no clients is now reclaimed (its pages evicted);
 * a namespace with a client attached keeps its row and its pages.
 */
static void test_namespace_rows_are_reclaimed(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	uint32_t t[2 * BT];
	char name[32];
	kvc_t *keep, *c;
	int i;

	m.name = "kept-model";
	assert_int_equal(kvc_open(&m, &o, &keep), 0);
	kvt_tokens(t, 2 * BT, 0, 6060);
	assert_int_equal(kvt_put(keep, t, 2 * BT, NULL), 0);
	for (i = 0; i < 80; i++) {
		snprintf(name, sizeof(name), "run-%d", i);
		m.name = name;
		assert_int_equal(kvc_open(&m, &o, &c), 0);
		assert_int_equal(kvt_put(c, t, 2 * BT, NULL), 0);	/* a fresh namespace */
		kvc_close(c);
	}
	assert_true(kvt_log_has(d, "which had no clients (its pages evicted)"));
	assert_int_equal(kvt_get(keep, t, 2 * BT), 2);	/* never reclaimed */
	kvc_close(keep);
}


/* CPU seconds (user + system) the process has used, from /proc. */
static double cpu_seconds(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');	/* comm may contain spaces */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
			 &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/*
 * Regression (review finding): a client that pipelines requests without
 * reading the replies and then half-closes made the daemon spin: with
 * replies pending it waited for EPOLLOUT|EPOLLRDHUP, and the level-
 * triggered RDHUP fired on every wait. This is a resource check, not a
 * speed one: a spinning daemon burns about one CPU second per second,
 * an idle one next to nothing; the bound sits far between, and a busy
 * machine can only make a spinning daemon look better, never an idle one
 * worse.
 */
struct halfcloser {
	const struct kvt_daemon *d;
	int ready[2];
	int go[2];
};

/* Pipeline ALLOCs without reading a reply, half-close, wait, exit. */
static int half_closer(void *arg)
{
	struct halfcloser *hc = arg;
	struct kvproto_hdr h = { KVPROTO_MAGIC, KVPROTO_ALLOC, 0, sizeof(struct kvproto_alloc), 1 };
	struct kvproto_alloc a = { 1, 0 };
	static uint8_t batch[2048 * (sizeof(h) + sizeof(a))];
	int fd = raw_connect(hc->d->sock), i, writes = 0;
	char b = 'r';

	hello(fd);
	for (i = 0; i < 2048; i++) {
		memcpy(batch + i * (sizeof(h) + sizeof(a)), &h, sizeof(h));
		memcpy(batch + i * (sizeof(h) + sizeof(a)) + sizeof(h), &a, sizeof(a));
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	/* Large writes: until the daemon stops reading and our buffer fills. */
	while (writes < 1000 && write(fd, batch, sizeof(batch)) > 0)
		writes++;
	if (writes == 1000 || shutdown(fd, SHUT_WR))
		return 2;
	if (write(hc->ready[1], &b, 1) != 1 || read(hc->go[0], &b, 1) != 1)
		return 3;
	return 0;
}

static void test_half_close_with_replies_pending_does_not_spin(void **state)
{
	struct kvt_daemon *d = *state;
	struct halfcloser hc = { .d = d };
	double before, after;
	pid_t p;
	char b;

	assert_int_equal(pipe(hc.ready), 0);
	assert_int_equal(pipe(hc.go), 0);
	p = kvt_fork(half_closer, &hc);
	assert_int_equal(read(hc.ready[0], &b, 1), 1);
	usleep(200000);		/* let it drain what it can and get stuck */
	before = cpu_seconds(d->pid);
	usleep(1000000);
	after = cpu_seconds(d->pid);
	assert_int_equal(write(hc.go[1], "g", 1), 1);
	assert_int_equal(kvt_wait(p), 0);
	assert_true(before >= 0 && after >= 0);
	assert_true(after - before < 0.5);
	{	/* its writing pages come back once it has exited */
		kvc_t *c = kvt_open(d, NULL);
		struct kvc_stats st;
		int i;

		assert_non_null(c);
		for (i = 0; i < 500; i++) {
			assert_int_equal(kvc_stats(c, &st), 0);
			if (!st.pages_writing)
				break;
			usleep(10000);
		}
		assert_int_equal(st.pages_writing, 0);
		kvc_close(c);
	}
	assert_serving(d, 37);
	close(hc.ready[0]);
	close(hc.ready[1]);
	close(hc.go[0]);
	close(hc.go[1]);
}

/*
 * Key squatting (issue #24, and #8's crafted collisions before it): a
 * client publishes its own tokens under the key of a block another prompt
 * will use. Before, the daemon indexed it (the key was new), and the
 * victim then missed that block for as long as the squatter pinned it
 * (its lookup verifies the tokens) and could not publish its own (a
 * collision, refused). Now the daemon recomputes every published key from
 * its parent, tokens and extra-keys digest: the squatter is refused and
 * disconnected, the victim publishes and hits.
 */
static int squatter(void *arg)
{
	const struct kvt_daemon *d = arg;
	struct kvproto_hello hi = { .version = KVPROTO_VERSION, .dtype_bytes = 2, .layers = 1,
				    .kv_heads = 2, .head_dim = 32, .block_tokens = BT,
				    .pos_kind = 1, .model = "kvt-tiny" };
	struct kvproto_alloc a = { 1, 0 };
	struct kvproto_count cnt = { 1, 0 };
	struct kvshm_key root, zero = { 0, 0 }, keys[3];
	uint8_t rep[sizeof(struct kvproto_count) + sizeof(struct kvproto_pg)];
	uint8_t msg[sizeof(struct kvproto_count) + sizeof(struct kvproto_pub) + BT * 4];
	uint32_t victim[3 * BT], mine[BT];
	struct kvproto_pub pub;
	struct kvproto_hdr rh;
	struct kvproto_pg pg;
	struct kvshm_ns ns;
	int fd = raw_connect(d->sock), i;
	int32_t err;

	alarm(20);	/* a daemon that takes the publish never closes on us */
	hello(fd);
	if (kvproto_hello_ns(&hi, &ns))
		return 2;
	root = kvshm_key_root(ns.id, NULL, 0);
	kvt_tokens(victim, 3 * BT, 0, 9191);
	kvshm_key_chain(root, root, zero, victim, 3 * BT, BT, keys);
	for (i = 0; i < BT; i++)
		mine[i] = victim[i] + 1;	/* other tokens */
	send_frame(fd, KVPROTO_ALLOC, &a, sizeof(a));
	if (read(fd, &rh, sizeof(rh)) != sizeof(rh) || rh.type != KVPROTO_ALLOC_R ||
	    read(fd, rep, sizeof(rep)) != sizeof(rep))
		return 3;
	memcpy(&pg, rep + sizeof(cnt), sizeof(pg));
	memset(&pub, 0, sizeof(pub));
	pub.page = pg.page;
	pub.gen = pg.gen;
	pub.key = keys[0];	/* the victim's first block's key */
	pub.parent = root;
	memcpy(msg, &cnt, sizeof(cnt));
	memcpy(msg + sizeof(cnt), &pub, sizeof(pub));
	memcpy(msg + sizeof(cnt) + sizeof(pub), mine, sizeof(mine));
	send_frame(fd, KVPROTO_PUBLISH, msg, sizeof(msg));
	return closed_by_daemon(fd, &err) && err == -EINVAL ? 0 : 4;
}

static void test_squatted_keys_refused(void **state)
{
	struct kvt_daemon *d = *state;
	uint32_t victim[3 * BT];
	int cached = -1;
	kvc_t *c;

	assert_int_equal(kvt_wait(kvt_fork(squatter, d)), 0);
	assert_true(kvt_log_has(d, "is not the key of its parent, tokens and extra keys"));
	/* The victim's prompt was not squatted: it publishes all of it and
	 * hits every block with its own bytes. */
	kvt_tokens(victim, 3 * BT, 0, 9191);
	c = kvt_open(d, NULL);
	assert_non_null(c);
	assert_int_equal(kvt_put(c, victim, 3 * BT, &cached), 0);
	assert_int_equal(cached, 3);
	assert_int_equal(kvt_get(c, victim, 3 * BT), 3);
	kvc_close(c);
	assert_serving(d, 40);
}

/*
 * Squatting across namespaces (issue #35): a client of model B reads model
 * A's chain root from the segment (block 0's parent) and publishes A's
 * block 0 exactly: A's root as the parent, A's tokens. Before, the key was
 * right for that parent and those tokens, so the daemon took it into B's
 * namespace; the index is shared, so A's own publish of the block was
 * refused as a collision and A's lookups missed while B held one pin. Now
 * every key carries its chain's root and the daemon recomputes it under
 * the publisher's own: the record with A's key is refused (B is
 * disconnected), the one with the key its own root gives is accepted into
 * B's key space, where A never looks, and A publishes and hits through
 * pool turnovers while B holds that page pinned.
 */
struct squat_b {
	const struct kvt_daemon *d;
	int go[2], done[2];	/* B reports (done), then waits for A (go) */
};

/* One raw client of "kvt-other" (A's geometry, another model): ALLOC one
 * page, PUBLISH A's block 0 under `key` with A's root and tokens. Returns
 * the PUBLISH's status (0 published), or -1000 - errno of a fatal ERROR. */
static int squat_publish(const char *sock, int want_a_key, int *fd_out, void **ledger)
{
	struct kvproto_hello hi = { .version = KVPROTO_VERSION, .dtype_bytes = 2, .layers = 1,
				    .kv_heads = 2, .head_dim = 32, .block_tokens = BT,
				    .pos_kind = 1, .model = "kvt-other" };
	struct kvproto_hello ha = hi;
	struct kvproto_alloc a = { 1, 0 };
	struct kvproto_count cnt = { 1, 0 };
	struct kvshm_key root_a, root_b, keys_a[4], zero = { 0, 0 };
	uint8_t rep[sizeof(struct kvproto_count) + sizeof(struct kvproto_pg)];
	uint8_t msg[sizeof(struct kvproto_count) + sizeof(struct kvproto_pub) + BT * 4];
	uint8_t pr[sizeof(struct kvproto_count) + sizeof(struct kvproto_pub_r)];
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	char hbuf[sizeof(struct kvproto_hdr) + sizeof(struct kvproto_hello_r)];
	struct iovec iov = { hbuf, sizeof(hbuf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct kvproto_hello_r hr;
	struct kvproto_pub_r res;
	uint32_t victim[4 * BT];
	struct kvproto_pub pub;
	struct kvproto_hdr rh;
	struct kvproto_pg pg;
	struct kvshm_ns ns_a, ns_b;
	int fds[3], fd = kvt_raw_connect(sock);
	int32_t err;

	memcpy(ha.model, "kvt-tiny", 9);
	if (fd < 0 || kvproto_hello_ns(&hi, &ns_b) || kvproto_hello_ns(&ha, &ns_a))
		return -1;
	if (kvt_send_frame(fd, KVPROTO_HELLO, &hi, sizeof(hi)) ||
	    recvmsg(fd, &mh, MSG_WAITALL) != (ssize_t)sizeof(hbuf))
		return -2;
	memcpy(fds, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof(fds));
	memcpy(&hr, hbuf + sizeof(rh), sizeof(hr));
	*ledger = mmap(NULL, hr.ledger_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
	close(fds[0]);
	close(fds[1]);
	close(fds[2]);
	if (*ledger == MAP_FAILED)
		return -3;
	/* A's chain as A computes it; B's key for the same parent and tokens. */
	root_a = kvshm_key_root(ns_a.id, NULL, 0);
	root_b = kvshm_key_root(ns_b.id, NULL, 0);
	kvt_tokens(victim, 4 * BT, 0, 7373);
	kvshm_key_chain(root_a, root_a, zero, victim, 4 * BT, BT, keys_a);
	kvt_send_frame(fd, KVPROTO_ALLOC, &a, sizeof(a));
	if (read(fd, &rh, sizeof(rh)) != sizeof(rh) || rh.type != KVPROTO_ALLOC_R ||
	    read(fd, rep, sizeof(rep)) != sizeof(rep))
		return -4;
	memcpy(&pg, rep + sizeof(cnt), sizeof(pg));
	/* Held in our ledger, as the library does: pinned once READY. */
	kvshm_ledger_hold(*ledger, 0, pg.page, pg.gen);
	memset(&pub, 0, sizeof(pub));
	pub.page = pg.page;
	pub.gen = pg.gen;
	pub.key = want_a_key ? keys_a[0] : kvshm_key_block(root_b, root_a, victim, BT, zero);
	pub.parent = root_a;
	memcpy(msg, &cnt, sizeof(cnt));
	memcpy(msg + sizeof(cnt), &pub, sizeof(pub));
	memcpy(msg + sizeof(cnt) + sizeof(pub), victim, BT * 4);
	kvt_send_frame(fd, KVPROTO_PUBLISH, msg, sizeof(msg));
	if (read(fd, &rh, sizeof(rh)) != sizeof(rh))
		return -5;
	if (rh.type == KVPROTO_ERROR) {
		struct kvproto_error e;

		if (read(fd, &e, sizeof(e)) != sizeof(e))
			return -6;
		err = e.err;
		close(fd);
		return -1000 + err;
	}
	if (rh.type != KVPROTO_PUBLISH_R || read(fd, pr, sizeof(pr)) != sizeof(pr))
		return -7;
	memcpy(&res, pr + sizeof(cnt), sizeof(res));
	*fd_out = fd;
	return res.status;
}

static int squatter_b(void *arg)
{
	struct squat_b *s = arg;
	int fd = -1, st[2];
	void *ledger = NULL;
	char b;

	alarm(60);
	st[0] = squat_publish(s->d->sock, 1, &fd, &ledger);	/* A's own key */
	st[1] = squat_publish(s->d->sock, 0, &fd, &ledger);	/* its own space */
	if (write(s->done[1], st, sizeof(st)) != sizeof(st))
		return 2;
	/* Holds the published page pinned (and its connection) until A is
	 * done, then exits. */
	if (read(s->go[0], &b, 1) != 1)
		return 3;
	close(fd);
	return 0;
}

static void test_other_namespace_cannot_squat(void **state)
{
	struct kvt_daemon *d = *state;
	struct squat_b s = { .d = d };
	uint32_t victim[4 * BT];
	int st[2], turn, cached = -1;
	pid_t b;
	kvc_t *a;

	assert_int_equal(pipe(s.go), 0);
	assert_int_equal(pipe(s.done), 0);
	b = kvt_fork(squatter_b, &s);
	assert_int_equal(read(s.done[0], st, sizeof(st)), sizeof(st));
	/* A's key from B: refused and disconnected. B's own: published, in
	 * B's key space. */
	assert_int_equal(st[0], -1000 - EINVAL);
	assert_int_equal(st[1], KVSHM_PUBLISHED);
	/* A publishes all of its prompt and hits it, through three pool
	 * turnovers (256 pages; 40 prompts of 8 blocks each) while B holds
	 * its page pinned. */
	kvt_tokens(victim, 4 * BT, 0, 7373);
	a = kvt_open(d, NULL);
	assert_non_null(a);
	for (turn = 0; turn < 4; turn++) {
		assert_true(kvt_put(a, victim, 4 * BT, &cached) >= 0);
		assert_int_equal(cached, 4);
		assert_int_equal(kvt_get(a, victim, 4 * BT), 4);
		if (turn < 3)
			assert_int_equal(kvt_flood(d, 40, 88000 + 100 * (uint32_t)turn), 0);
	}
	assert_false(kvt_log_has(d, "key collisions refused"));
	assert_int_equal(write(s.go[1], "x", 1), 1);
	assert_int_equal(kvt_wait(b), 0);
	/* And after B let go: A still publishes and hits. */
	assert_int_equal(kvt_flood(d, 40, 89000), 0);
	assert_true(kvt_put(a, victim, 4 * BT, &cached) >= 0);
	assert_int_equal(cached, 4);
	assert_int_equal(kvt_get(a, victim, 4 * BT), 4);
	kvc_close(a);
	close(s.go[0]);
	close(s.go[1]);
	close(s.done[0]);
	close(s.done[1]);
	assert_serving(d, 41);
}

/* A process that writes into its read-only mapping of the index dies
 * alone; the kernel also refuses to make that mapping writable. */
static void test_write_to_the_index_kills_only_the_writer(void **state)
{
	struct kvt_daemon *d = *state;
	pid_t p = fork();

	if (!p) {
		struct kvproto_hello_r hr;
		int fds[3], fd = raw_connect(d->sock);
		char *seg;

		hello_fds(fd, fds, &hr);
		seg = mmap(NULL, hr.segment_bytes, PROT_READ, MAP_SHARED, fds[0], 0);
		if (seg == MAP_FAILED)
			_exit(2);
		/* Sealed: no writable mapping, no upgrade of ours. */
		if (mmap(NULL, hr.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0) !=
		    MAP_FAILED)
			_exit(3);
		if (!mprotect(seg, hr.segment_bytes, PROT_READ | PROT_WRITE))
			_exit(4);
		/* cmocka's handler came along with fork(): the default, please. */
		signal(SIGSEGV, SIG_DFL);
		/* Flip a byte of the index buckets: SIGSEGV here. */
		((volatile char *)seg)[((const struct kvshm_header *)seg)->off_buckets] ^= 1;
		_exit(5);
	}
	assert_int_equal(kvt_wait(p), 128 + SIGSEGV);
	assert_serving(d, 38);
}

/* A client that publishes a page it holds, but names a generation it was
 * never given, is refused and disconnected; its page comes back when it
 * exits. */
static void test_wrong_generation_is_refused(void **state)
{
	struct kvt_daemon *d = *state;
	pid_t p = fork();

	if (!p) {
		struct kvproto_alloc a = { 1, 0 };
		struct kvproto_hdr rh;
		uint8_t rep[sizeof(struct kvproto_count) + sizeof(struct kvproto_pg)];
		uint8_t msg[sizeof(struct kvproto_count) + sizeof(struct kvproto_pub) + BT * 4];
		struct kvproto_count cnt = { 1, 0 };
		struct kvproto_pub pub = { .key = { 5, 6 } };
		struct kvproto_pg pg;
		int fd = raw_connect(d->sock);
		int32_t err;

		hello(fd);
		send_frame(fd, KVPROTO_ALLOC, &a, sizeof(a));
		if (read(fd, &rh, sizeof(rh)) != sizeof(rh) || rh.type != KVPROTO_ALLOC_R ||
		    read(fd, rep, sizeof(rep)) != sizeof(rep))
			_exit(2);
		memcpy(&pg, rep + sizeof(cnt), sizeof(pg));
		pub.page = pg.page;
		pub.gen = pg.gen + 1;	/* the lie */
		memset(msg, 0, sizeof(msg));
		memcpy(msg, &cnt, sizeof(cnt));
		memcpy(msg + sizeof(cnt), &pub, sizeof(pub));
		send_frame(fd, KVPROTO_PUBLISH, msg, sizeof(msg));
		_exit(closed_by_daemon(fd, &err) && err == -EINVAL ? 0 : 3);
	}
	assert_int_equal(kvt_wait(p), 0);
	assert_true(kvt_log_has(d, "does not hold WRITING at that generation"));
	assert_serving(d, 39);
}


/* Run kvcached with args; return its exit status, stderr in out. */
static int run_daemon(const char *const *args, char *out, size_t outlen)
{
	int st = kvt_run(NULL, args, out, outlen);

	assert_true(st >= 0);
	return st;
}

static void test_bad_config_and_flags(void **state)
{
	char out[8192], path[] = "/tmp/kvt-conf.XXXXXX";
	int fd;

	(void)state;
	{
		const char *a[] = { "--pool-size", "10X", NULL };

		assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "pool-size 10X"));
	}
	{
		const char *a[] = { "--no-such-flag", NULL };

		assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "--no-such-flag: unknown option"));
	}
	{
		const char *a[] = { "--page-size", "5000", "--socket", "/tmp/x.sock", NULL };

		assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "page-size 5000"));
	}
	{
		const char *a[] = { "--block-tokens", NULL };

		assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "--block-tokens: needs a value"));
	}
	{
		const char *a[] = { "--pool", "tpu", NULL };

		assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "pool tpu: must be host or cuda"));
	}
	fd = mkstemp(path);
	assert_true(fd >= 0);
	{
		const char conf[] = "# kvcached test config\n\npool-size = 4M\n"
				    "page-size = 4K\nlow-watermark = lots\n";
		const char *a[] = { "--config", path, NULL };
		char want[128];

		assert_int_equal(write(fd, conf, sizeof(conf) - 1), (ssize_t)sizeof(conf) - 1);
		close(fd);
		assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
		snprintf(want, sizeof(want), "%s:5: low-watermark lots", path);
		assert_non_null(strstr(out, want));
	}
	{
		const char *a[] = { "--config", "/nonexistent/kvcached.conf", NULL };

		assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "/nonexistent/kvcached.conf"));
	}
	unlink(path);
	{
		const char *a[] = { "--help", NULL };

		assert_int_equal(run_daemon(a, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "--pool-size SIZE"));
	}
}

static void test_second_daemon_on_a_live_socket(void **state)
{
	struct kvt_daemon *d = *state;
	const char *a[] = { "--socket", d->sock, "--pool-size", "1M", "--page-size", "4K", NULL };
	char out[4096];

	assert_int_not_equal(run_daemon(a, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "another kvcached is serving it"));
	assert_serving(d, 34);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_geometry_that_does_not_fit),
		cmocka_unit_test(test_untrusted_peer),
		cmocka_unit_test(test_garbage_and_lies_on_the_socket),
		cmocka_unit_test(test_client_scribbles_its_ledger),
		cmocka_unit_test(test_dropped_live_client_keeps_its_pins),
		cmocka_unit_test(test_row_taken_again_before_the_old_pidfd_event),
		cmocka_unit_test(test_namespace_rows_are_reclaimed),
		cmocka_unit_test(test_half_close_with_replies_pending_does_not_spin),
		cmocka_unit_test(test_squatted_keys_refused),
		cmocka_unit_test(test_other_namespace_cannot_squat),
		cmocka_unit_test(test_write_to_the_index_kills_only_the_writer),
		cmocka_unit_test(test_wrong_generation_is_refused),
		cmocka_unit_test(test_bad_config_and_flags),
		cmocka_unit_test(test_second_daemon_on_a_live_socket),
	};

	return cmocka_run_group_tests_name("integration/refuse", tests, setup, kvt_teardown);
}
