// SPDX-License-Identifier: MIT
/*
 * publish.c - kvbench's publish mode: per request of N fresh blocks,
 * kvc_req_new, kvc_lookup (a miss), kvc_alloc (one round trip), memcpy of
 * a page into each granted pool page, kvc_publish (one round trip),
 * kvc_req_free; in blocks/s and GB/s (1e9 bytes) of page bytes written and
 * published, against plain single-core memcpy of the same page bytes from
 * the same source page into a shared-memory (memfd, MAP_SHARED,
 * pre-faulted) ring larger than the last-level cache, like the pool it
 * stands for.
 *
 * 4 KiB pages (1, 16, 256 blocks a request: the round trips dominate) on a
 * 4 MiB pool, then 2 MiB pages (Llama-3-8B geometry; 1, 4, 16 blocks) on a
 * 256 MiB pool. The pool is written once through before timing so that
 * first-touch page faults are not counted; after that the daemon evicts to
 * make room, the steady state of a busy cache.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"

static const size_t pub_sizes[] = { 1, 4, 16 };		/* 2 MiB pages */
static const size_t small_pub_sizes[] = { 1, 16, 256 };	/* 4 KiB pages */
static char pub_name[64], small_name[64];

static uint64_t pub_seed(uint64_t ctr)
{
	return (1ull << 40) + ctr;
}

/* One request of n fresh blocks; returns the ns it took. */
uint64_t pub_request(struct pubctx *p, size_t n)
{
	struct kvc_req *r;
	uint64_t t0, t1;
	size_t i;
	int got;

	make_tokens(p->tokens, n * BT, pub_seed(p->ctr++));
	t0 = now_ns();
	ck(kvc_req_new(p->c, p->tokens, n * BT, NULL, 0, &r), "kvc_req_new");
	got = ck(kvc_lookup(r), "kvc_lookup");
	if (got)
		die("a fresh prompt hit %d blocks: namespace not private?", got);
	got = ck(kvc_alloc(r), "kvc_alloc");
	if ((size_t)got != n)
		die("kvc_alloc granted %d of %zu pages (pool too small or pinned full?)", got, n);
	for (i = 0; i < n; i++) {
		void *dst = kvc_block(r, i);

		if (!dst)
			die("kvc_block(%zu) is NULL after kvc_alloc", i);
		memcpy(dst, p->src, p->pb);
	}
	got = ck(kvc_publish(r), "kvc_publish");
	if ((size_t)got != n)
		die("kvc_publish cached %d of %zu blocks", got, n);
	kvc_req_free(r);
	t1 = now_ns();
	return t1 - t0;
}

/* The last request's blocks must hit and hold the source bytes. */
void pub_verify(struct pubctx *p, size_t n)
{
	struct kvc_req *r;
	size_t i;
	int got;

	make_tokens(p->tokens, n * BT, pub_seed(p->ctr - 1));
	ck(kvc_req_new(p->c, p->tokens, n * BT, NULL, 0, &r), "kvc_req_new");
	got = ck(kvc_lookup(r), "kvc_lookup");
	if ((size_t)got != n)
		die("the last published request hit %d of %zu blocks", got, n);
	for (i = 0; i < n; i++)
		if (memcmp(kvc_block(r, i), p->src, p->pb))
			die("published page %zu does not hold the bytes written", i);
	kvc_req_free(r);
}

/*
 * Write the pool once through so first-touch faults are not timed: the
 * daemon reserves the pool with posix_fallocate, which leaves shmem pages
 * to be zeroed on first write (and, in a VM, backed by the host then): up
 * to 20x slower than a warm write. Capped at 4 GiB.
 */
void pub_warm(struct pubctx *p, size_t maxn)
{
	struct kvc_stats st;
	size_t warm, done;

	ck(kvc_stats(p->c, &st), "kvc_stats");
	warm = st.pages_total;
	if (warm * p->pb > (4ull << 30)) {
		warm = (4ull << 30) / p->pb;
		fprintf(stderr, "kvbench: warming only 4 GiB of a %llu-page pool; figures may include first-touch page faults\n",
			(unsigned long long)st.pages_total);
	}
	for (done = 0; done < warm; done += maxn)
		pub_request(p, maxn);
}

/*
 * Publish rows for sizes[] (blocks per request) through handle c.
 * The peer writes the same bytes with memcpy into a memfd ring of
 * ring_bytes. gbs: also add GB/s rows.
 */
static void bench_publish(kvc_t *c, const size_t *sizes, size_t nsizes, size_t ring_bytes,
			  bool gbs)
{
	struct pubctx p = { .c = c };
	size_t i, ring_pages, pos = 0, maxn = 0;
	struct kvc_stats st;
	uint8_t *ring, *src;
	int fd, r, k;
	void *m;

	p.pb = kvc_page_bytes(c);
	ck(kvc_stats(c, &st), "kvc_stats");
	/* A running daemon's pool may be too small for the largest requests
	 * (slots bigger than our pages): those rows are left out, said so. */
	for (i = 0; i < nsizes; i++) {
		if (4 * sizes[i] > st.pages_total)
			fprintf(stderr, "kvbench: skipping publish of %zu-block requests: the pool has only %llu pages\n",
				sizes[i], (unsigned long long)st.pages_total);
		else if (sizes[i] > maxn)
			maxn = sizes[i];
	}
	if (!maxn)
		return;
	p.tokens = xmalloc(maxn * BT * sizeof(uint32_t));
	if (posix_memalign(&m, 4096, p.pb))
		die("out of memory (source page)");
	src = m;
	for (i = 0; i < p.pb / 8; i++)
		((uint64_t *)src)[i] = mix64(i);
	p.src = src;

	ring_pages = ring_bytes / p.pb;
	if (ring_pages < 2 * maxn)
		ring_pages = 2 * maxn;
	fd = memfd_create("kvbench-peer", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)(ring_pages * p.pb)))
		die("peer ring memfd (%zu bytes): %s", ring_pages * p.pb, strerror(errno));
	ring = mmap(NULL, ring_pages * p.pb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ring == MAP_FAILED)
		die("mmap peer ring: %s", strerror(errno));
	close(fd);
	memset(ring, 1, ring_pages * p.pb);	/* fault it in, as the pool will be */

	pub_warm(&p, maxn);

	for (i = 0; i < nsizes; i++) {
		size_t n = sizes[i];
		uint64_t ops[ROUNDS][2], ns[ROUNDS][2], t0, end, t;
		double rate[2][ROUNDS], med[2];

		if (n > maxn)
			continue;
		memset(ops, 0, sizeof(ops));
		memset(ns, 0, sizeof(ns));
		t0 = now_ns();
		for (r = 0; r < ROUNDS; r++) {
			for (k = 0; k < 2; k++) {
				end = t0 + (uint64_t)(r * 2 + k + 1) * (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
				do {
					if (k == 0) {
						ns[r][0] += pub_request(&p, n);
					} else {
						size_t b;

						t = now_ns();
						for (b = 0; b < n; b++, pos++)
							memcpy(ring + (pos % ring_pages) * p.pb, src, p.pb);
						ns[r][1] += now_ns() - t;
					}
					ops[r][k] += n;
				} while (now_ns() < end);
			}
		}
		pub_verify(&p, n);
		for (k = 0; k < 2; k++) {
			for (r = 0; r < ROUNDS; r++)
				rate[k][r] = ns[r][k] ? (double)ops[r][k] * 1e9 / (double)ns[r][k] : 0;
			qsort(rate[k], ROUNDS, sizeof(double), cmp_dbl);
			med[k] = rate[k][ROUNDS / 2];
		}
		add_row(&(struct row){ "publish", "publish", 1, n, p.pb, NULL, "blocks/s",
				       "memcpy", med[0], med[1], NULL });
		if (gbs)
			add_row(&(struct row){ "publish", "publish", 1, n, p.pb, NULL, "GB/s",
					       "memcpy", med[0] * (double)p.pb / 1e9,
					       med[1] * (double)p.pb / 1e9, NULL });
	}
	sink += ring[(pos ? pos - 1 : 0) % ring_pages * p.pb];
	munmap(ring, ring_pages * p.pb);
	free(src);
	free(p.tokens);
}

static void bench_publish_small(const char *sock)
{
	struct kvc_model m = tiny_model(small_name);
	kvc_t *c = open_model(sock, &m);

	bench_publish(c, small_pub_sizes, NELEM(small_pub_sizes), 64ull << 20, false);
	bench_close(c);
}

static void bench_publish_big(const char *sock)
{
	static const uint32_t layers[] = { 32, 16, 8, 4, 2, 1 };
	char err[256] = "";
	kvc_t *c = NULL;
	size_t i;
	int rc = -EMEDIUMTYPE;

	/* 2 MiB pages (32 layers) where the pool's slots take them; a
	 * running daemon with smaller slots gets fewer layers. */
	for (i = 0; i < NELEM(layers) && rc == -EMEDIUMTYPE; i++) {
		struct kvc_model m = big_model(pub_name, layers[i]);

		rc = try_open(sock, &m, &c, err, sizeof(err));
	}
	if (rc)
		die("kvc_open(%s) on %s failed: %s%s%s%s", pub_name, sock, kvc_strerror(rc),
		    *err ? " (" : "", err, *err ? ")" : "");
	if (kvc_block_tokens(c) != BT)
		die("daemon uses %zu-token blocks; kvbench needs %d", kvc_block_tokens(c), BT);
	publish_page_bytes = kvc_page_bytes(c);
	bench_publish(c, pub_sizes, NELEM(pub_sizes),
		      opt.quick ? (64ull << 20) : (128ull << 20), true);
	bench_close(c);
}

void mode_publish(void)
{
	snprintf(small_name, sizeof(small_name), "kvbench-publish-small-%d", (int)main_pid);
	snprintf(pub_name, sizeof(pub_name), "kvbench-publish-%d", (int)main_pid);
	bench_publish_small(opt.socket ? opt.socket : daemon_start("publish-4k", "4K", "4M"));
	bench_publish_big(opt.socket ? opt.socket
				     : daemon_start("publish-2m", "2M", opt.quick ? "128M" : "256M"));
	if (!opt.socket)
		daemon_stop(false);
}
