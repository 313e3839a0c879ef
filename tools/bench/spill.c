// SPDX-License-Identifier: MIT
/*
 * spill.c - kvbench's spill mode: the spill tier's write bandwidth (pages
 * evicted from a full pool to NVMe slots) and restore bandwidth (slots read
 * back into pool pages and pinned), each next to a raw O_DIRECT transfer of
 * the same pages on the same filesystem at the same concurrency, in the
 * same run.
 *
 * kvcached side. A daemon with a 2 MiB-page pool and a spill area in
 * kvbench's own folder (io_uring) is filled with fresh prompts. Then one
 * request asks for 7/8 of the pool's pages: kvc_alloc returns only once
 * the daemon has evicted them and their spill writes are done, so the
 * bytes the spill counters grew by over that round trip, divided by its
 * time, is the write figure. The granted pages are given back unpublished,
 * which leaves them free for the restores: the first prompts are looked
 * up, and kvc_restore (one round trip: the daemon reads every slot of the
 * run, checks its checksums, publishes the pages; then the client pins
 * them) is timed; read bytes over the restores' time is the read figure.
 * Every restored page is compared with what was published.
 *
 * Peer. The same number of page-size O_DIRECT writes (into a fresh file
 * with its blocks reserved, like the slot files), then reads, of a file in
 * the same folder, through io_uring with registered buffers and 32 page
 * I/Os in flight (kvcached keeps up to 32 slots in flight, each a
 * 4 KiB header and a page). Its buffers are 32 pages of the pool itself,
 * granted to a request of its own and never published: the memory the
 * tier writes from and reads into. (A buffer of the benchmark's own had
 * the peer at 1.2 to 5.2 GB/s on one VM as the guest's memory happened to
 * be laid out, while the same disk wrote pool pages at 0.6 to 1.8: a
 * virtual disk can be that sensitive to how many pieces a 2 MiB transfer
 * is in.) Each peer figure is the mean of one run just before and one
 * just after kvcached's, so drift of the disk (or of the host's cache
 * under a VM's virtual disk) shows in both alike.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../libclient/observe.h"
#include "bench.h"

#define PAGE (2u << 20)
#define QD 32
/* The peer's buffers: QD pool pages (--quick: 4 of its 64, the ALLOC
 * needs 56 of them; the 32 I/Os in flight then share them). */
#define NBUF (opt.quick ? 4u : QD)
/* Blocks per fill request: a 2,048-token document (--quick: 256 tokens,
 * for its 64-page pool). */
#define FILL_BLOCKS (opt.quick ? 16u : 128u)

static struct kvshm_stats stats_of(const char *sock)
{
	struct kvshm_stats s;
	struct kvobs o;
	char err[256];

	if (kvobs_attach(sock, &o, err, sizeof(err)))
		die("spill: observer attach: %s", err);
	memcpy(&s, kvshm_stats(o.h), sizeof(s));
	kvobs_detach(&o);
	return s;
}

#define ST(s, f) atomic_load_explicit(&(s).f, memory_order_relaxed)

/* Until the spill and eviction counters stand still (tick-driven spills
 * of the fill are done). */
static void settle(const char *sock)
{
	struct kvshm_stats a = stats_of(sock), b;
	int i;

	for (i = 0; i < 500; i++) {
		sleep_ms(20);
		b = stats_of(sock);
		if (ST(a, spills) == ST(b, spills) && ST(a, evictions) == ST(b, evictions))
			return;
		a = b;
	}
	die("spill: the daemon's spill writes did not settle");
}

static uint64_t prompt_seed(size_t i)
{
	return 0x5b111ull * 1000003u + i;
}

/* One request of n fresh blocks, every page a copy of src. */
static void publish(kvc_t *c, uint32_t *tok, size_t n, uint64_t seed, const uint8_t *src)
{
	struct kvc_req *r;
	size_t i;

	make_tokens(tok, n * BT, seed);
	ck(kvc_req_new(c, tok, n * BT, NULL, 0, &r), "kvc_req_new");
	ck(kvc_lookup(r), "kvc_lookup");
	if ((size_t)ck(kvc_alloc(r), "kvc_alloc") != n)
		die("spill: kvc_alloc granted fewer than %zu pages", n);
	for (i = 0; i < n; i++)
		memcpy(kvc_block(r, i), src, PAGE);
	if ((size_t)ck(kvc_publish(r), "kvc_publish") != n)
		die("spill: kvc_publish cached fewer than %zu blocks", n);
	kvc_req_free(r);
}

/* The raw peer: n page-size O_DIRECT writes (or reads) of path, QD in
 * flight, from (into) the NBUF pages buf[]. Returns GB/s. */
static double raw_pass(const char *path, size_t n, bool write, uint8_t *const *buf)
{
	struct io_uring ring;
	struct iovec iov[QD];
	unsigned nbuf = NBUF;
	size_t sent = 0, done = 0, k;
	uint64_t t0, t1;
	int fd, rc;

	for (k = 0; k < nbuf; k++)
		iov[k] = (struct iovec){ buf[k], PAGE };

	/* Writes go to a fresh file with its blocks reserved, as kvcached's
	 * slot files are; reads read what the last write pass wrote. */
	if (write)
		unlink(path);
	fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0)
		die("spill: open %s with O_DIRECT: %s", path, strerror(errno));
	if (write && (rc = posix_fallocate(fd, 0, (off_t)n * PAGE)))
		die("spill: fallocate %s: %s", path, strerror(rc));
	if ((rc = io_uring_queue_init(QD, &ring, 0)))
		die("spill: io_uring_queue_init: %s", strerror(-rc));
	if ((rc = io_uring_register_buffers(&ring, iov, nbuf)))
		die("spill: io_uring_register_buffers: %s", strerror(-rc));
	t0 = now_ns();
	while (done < n) {
		struct io_uring_cqe *cqe;

		while (sent < n && sent - done < QD) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			int b = (int)(sent % nbuf);

			if (write)
				io_uring_prep_write_fixed(sqe, fd, buf[b], PAGE, (uint64_t)sent * PAGE, b);
			else
				io_uring_prep_read_fixed(sqe, fd, buf[b], PAGE, (uint64_t)sent * PAGE, b);
			sent++;
		}
		io_uring_submit(&ring);
		if ((rc = io_uring_wait_cqe(&ring, &cqe)))
			die("spill: io_uring_wait_cqe: %s", strerror(-rc));
		if (cqe->res != (int)PAGE)
			die("spill: raw O_DIRECT %s: %s", write ? "write" : "read",
			    cqe->res < 0 ? strerror(-cqe->res) : "short transfer");
		io_uring_cqe_seen(&ring, cqe);
		done++;
	}
	t1 = now_ns();
	io_uring_queue_exit(&ring);
	close(fd);
	return (double)n * PAGE / (double)(t1 - t0);
}

static void row(const char *op, size_t pages, const char *peer, double kv, double pr,
		const char *skipped)
{
	add_row(&(struct row){ "spill", op, 1, pages, PAGE, NULL, "GB/s", peer, kv, pr,
			       skipped });
}

void mode_spill(void)
{
	const char *pool = opt.quick ? "128M" : "1G";
	size_t npages = (opt.quick ? 128u : 1024u) / 2, fill, want, p, nprompts, restored = 0;
	struct kvshm_stats s0, s1;
	char spill_size[32], name[64], raw[300];
	uint64_t t0, t_alloc, t_restore = 0;
	uint8_t *src;
	uint32_t *tok;
	struct kvc_model m;
	struct kvc_req *r, *peer;
	uint8_t *buf[QD];
	const char *sock;
	double w_a, w_b, r_a, r_b, kv_w, kv_r;
	kvc_t *c;

	if (opt.socket) {
		row("spill-write", 0, "odirect-write", 0, 0,
		    "needs a daemon with a spill tier that kvbench starts");
		return;
	}
	/* Room for everything spilled twice over, headers included. */
	snprintf(spill_size, sizeof(spill_size), "%zuM", npages * 2 * 3);
	{
		const char *args[] = { "--spill-dir", run_dir(), "--spill-size", spill_size,
				       "--spill-io", "uring", NULL };

		sock = daemon_start_args("spill", "2M", pool, args);
	}
	snprintf(name, sizeof(name), "kvbench-spill-%d", (int)main_pid);
	m = big_model(name, 32);	/* 32 x 64 KiB = 2 MiB pages */
	c = open_model(sock, &m);
	if (kvc_page_bytes(c) != PAGE)
		die("spill: model pages are %zu bytes, not %u", kvc_page_bytes(c), PAGE);
	src = xmalloc(PAGE);
	for (p = 0; p < PAGE / 8; p++)
		((uint64_t *)src)[p] = mix64(p);
	want = npages * 7 / 8;
	tok = xmalloc((want > FILL_BLOCKS ? want : FILL_BLOCKS) * BT * sizeof(uint32_t));
	snprintf(raw, sizeof(raw), "%s/raw-odirect.bin", run_dir());

	/* The peer's buffers: NBUF pool pages, held WRITING to the end, with
	 * what every published page holds. */
	make_tokens(tok, NBUF * BT, prompt_seed(200000));
	ck(kvc_req_new(c, tok, NBUF * BT, NULL, 0, &peer), "kvc_req_new");
	ck(kvc_lookup(peer), "kvc_lookup");
	if ((size_t)ck(kvc_alloc(peer), "kvc_alloc") != NBUF)
		die("spill: kvc_alloc granted fewer than %u pages for the peer's buffers", NBUF);
	for (p = 0; p < NBUF; p++) {
		buf[p] = kvc_block(peer, p);
		if (!buf[p])
			die("spill: no page for the peer's buffer %zu", p);
		memcpy(buf[p], src, PAGE);
	}

	/* Fill the rest of the pool (the tick spills the overflow as it
	 * goes). */
	fill = npages - NBUF;
	nprompts = fill / FILL_BLOCKS;
	for (p = 0; p < nprompts; p++)
		publish(c, tok, FILL_BLOCKS, prompt_seed(p), src);
	settle(sock);

	/* Spill: one ALLOC for 7/8 of the pool, timed to its reply. */
	make_tokens(tok, want * BT, prompt_seed(100000));
	ck(kvc_req_new(c, tok, want * BT, NULL, 0, &r), "kvc_req_new");
	ck(kvc_lookup(r), "kvc_lookup");
	w_a = raw_pass(raw, want, true, buf);
	s0 = stats_of(sock);
	t0 = now_ns();
	if ((size_t)ck(kvc_alloc(r), "kvc_alloc") != want)
		die("spill: kvc_alloc granted fewer than %zu pages", want);
	t_alloc = now_ns() - t0;
	s1 = stats_of(sock);
	w_b = raw_pass(raw, want, true, buf);
	kvc_req_free(r);	/* the pages go back free: room for restores */
	kv_w = (double)(ST(s1, spill_write_bytes) - ST(s0, spill_write_bytes)) / (double)t_alloc;
	if (ST(s1, spills) == ST(s0, spills))
		die("spill: the ALLOC spilled nothing (spill tier not running?)");

	/* Restore the first prompts, while free pages last. */
	r_a = raw_pass(raw, want, false, buf);
	s0 = stats_of(sock);
	for (p = 0; p < nprompts && restored + FILL_BLOCKS <= want * 7 / 8; p++) {
		size_t n, i;
		int hits;

		make_tokens(tok, FILL_BLOCKS * BT, prompt_seed(p));
		ck(kvc_req_new(c, tok, FILL_BLOCKS * BT, NULL, 0, &r), "kvc_req_new");
		ck(kvc_lookup(r), "kvc_lookup");
		n = kvc_req_spilled(r);
		if (n) {
			t0 = now_ns();
			hits = ck(kvc_restore(r), "kvc_restore");
			t_restore += now_ns() - t0;
			restored += n;
			for (i = 0; i < (size_t)hits; i++)
				if (memcmp(kvc_block(r, i), src, PAGE))
					die("spill: restored page %zu of prompt %zu differs from what was published",
					    i, p);
		}
		kvc_req_free(r);
	}
	s1 = stats_of(sock);
	r_b = raw_pass(raw, want, false, buf);
	unlink(raw);
	if (!restored || ST(s1, restores) == ST(s0, restores))
		die("spill: nothing was restored");
	if (ST(s1, spills) != ST(s0, spills))
		fprintf(stderr, "kvbench: spill: %llu pages were spilled during the restores\n",
			(unsigned long long)(ST(s1, spills) - ST(s0, spills)));
	kv_r = (double)(ST(s1, spill_read_bytes) - ST(s0, spill_read_bytes)) / (double)t_restore;

	row("spill-write", want, "odirect-write", kv_w,
	    (w_a + w_b) / 2, NULL);
	row("restore", restored, "odirect-read", kv_r, (r_a + r_b) / 2, NULL);
	kvc_req_free(peer);
	kvc_close(c);
	daemon_stop(false);
	free(src);
	free(tok);
}
