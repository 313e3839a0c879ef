// SPDX-License-Identifier: MIT
/*
 * daemon_frames.c - fuzz target for what kvcached does with a client's
 * frames and with the ledger memory each client may write, in-process.
 *
 * One struct kvd as main.c builds it, only small: a 64-page segment in a
 * memfd (re-initialised for every input, block_tokens chosen by the first
 * byte), a host pool memfd, up to 4 client rows whose sockets are one end
 * of a socketpair each (we hold the other end, read every reply and close
 * every descriptor that comes with one). The input is a list of operations,
 * each one byte (low four bits: the kind, 0-6 FRAME, 7-8 FRAME_FIX, then
 * TICK, HANGUP, PIN, LEDGER, TOUCH, HIT, EXIT; bits 4-5: the client row;
 * bits 6-7 non-zero: a new connection gets a pidfd) and its arguments:
 *
 *   FRAME      a header and payload, checked as server.c's do_read checks
 *              a header (that check is repeated below: do_read is static)
 *              and dispatched by the daemon's own kvd_server_frame; a new
 *              connection is accepted first when
 *              the chosen row has none (with or without a pidfd, i.e. a
 *              client that lingers or not when its connection ends)
 *   FRAME_FIX  the same, with the (page, gen) of each PUBLISH or FREE
 *              record replaced by one the last ALLOC_R granted, so that
 *              the fuzzer reaches publish and free without guessing gens;
 *              and the (key, parent) of some ALLOC_KEYS claims and PUBLISH
 *              records replaced by those of a page in flight or cached
 *              now, so that it reaches announcements taken, taken over and
 *              refused for single flight; and some claims' keys made the
 *              keys a PUBLISH of their tokens gives, so that ranks writing
 *              slices of one page reach its publish (fix_claim_key)
 *   TICK       kvd_evict_tick + kvd_registry_tick + kvd_slice_tick, as
 *              the timer does (slice-timeout-ms is 0: a page several ranks
 *              write is given up at the next tick unless whole)
 *   HANGUP     the client closes its socket (do_read's hang-up path)
 *   EXIT       a lingering client's process exits (the pidfd event)
 *   PIN, LEDGER, TOUCH, HIT
 *              the client writes its own ledger: a real pin (tracked) or
 *              a raw slot value, arbitrary bytes anywhere in the ledger
 *              (its header and ring heads included), an access-ring
 *              entry (a page, or a run entry, well-formed or not), a
 *              hit-ring record
 *
 * Bits 3 and up of the first byte pick the eviction policy (modulo the
 * number of policies: lru, s3fifo, clock); after every step the policy
 * must hold exactly the READY pages.
 *
 * Tenants and operators (issue #35): the daemon has a configured tenant
 * (salt "fz", a share of 40%) beside the tenant share (60%) and the
 * namespace share (70%); HELLOs with that salt reach it. FRAME_FIX points
 * a PIN's keys at a chain of cached blocks of the client's own key space,
 * and an ADMIN's model at a namespace in use and, to pin, its tokens at
 * such a chain (unsalted, or the tenant's). After every operation the
 * pins' holds, the tenants' and namespaces' accounts and the tenant rows'
 * gauges must match what the page table and the clients say.
 *
 * Bit 2 of the first byte turns the spill tier on for the input: a spill
 * area of N_SLOTS slots in a private folder (fresh for every input), its
 * I/O done inline (KVD_SIO_SYNC) and reaped after every operation as the
 * main loop would on the eventfd; FRAME_FIX then also points a RESTORE's
 * or a FETCH's keys at blocks that are spilled now. (FETCH asks the remote
 * tier too; there is none here, so tier.c's parsing, the spill part and
 * the reply are what it reaches.)
 *
 * After every operation the whole state is checked: page table, free
 * stack, index (entries naming pages or spill slots, windows, spill
 * hints), the slot table, statistics (and their
 * conservation laws), client rows and their WRITING counts, namespace rows,
 * the top sketch, the scratch marks, every reply (one per request, same
 * seq, decodable, fatal errors disconnect, granted pages really granted),
 * that no pin this target took and still holds was evicted, and (on the
 * first ticks and at the end) that the /metrics page is well-formed
 * whatever names clients chose. At the end every client leaves (as
 * kvd_server_close does) and nothing may be left: no WRITING page, no
 * client, no descriptor, no allocation (LeakSanitizer).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../lib/utf8_oracle.h"
#include "../../daemon/config.h"
#include "../../daemon/util/closer.h"
#include "../../daemon/core/kvd.h"
#include "../../daemon/core/evict.h"
#include "../../daemon/core/nsstat.h"
#include "../../daemon/core/pin.h"
#include "../../daemon/core/quota.h"
#include "../../daemon/core/registry.h"
#include "../../daemon/core/reply.h"
#include "../../daemon/core/restore.h"
#include "../../daemon/core/slice.h"
#include "../../daemon/server/server.h"
#include "../../daemon/util/log.h"
#include "../../daemon/tier/spill.h"
#include "../../fmt/spill_slot.h"
#include "../../daemon/tier/spill_io.h"
#include "../../shm/index.h"
#include "../../shm/ledger.h"
#include "../../shm/key.h"
#include "../../shm/page.h"
#include "../../shm/stats.h"

#include "check.h"

/* The checks give libFuzzer no coverage to chase (and cost less). */
#define NO_COVERAGE __attribute__((no_sanitize("coverage"), noinline))

#define N_PAGES 64
#define PAGE_BYTES 16384
#define MAX_CLIENTS 4
#define MAX_NS 3		/* fewer than clients: the table can fill */
#define MAX_PINS 48
#define RX_BYTES 16384
#define MAX_TRACK 16
#define N_SLOTS 24		/* fewer than pages: the area fills and recycles */

static char spill_dir[64];	/* the spill area's folder, for the process */
static bool spill_on;		/* this input has a spill tier */
/*
 * A RESET zeroed the counters: the pages READY and WRITING then are what
 * the conservation laws below start from (reset_seen: a RESET_R came in
 * this operation; the bases are taken at the next check).
 */
static bool reset_seen;
static uint64_t base_ready, base_writing;

static struct kvd d;
static struct kvd_memfd seg;

/* Our side of each client row. */
static struct peer {
	int fd;			/* our socket end, -1 when none */
	int dfd;		/* the daemon's end, as accepted */
	uint8_t rx[RX_BYTES];
	size_t rx_len;
	bool eof;
	uint32_t n_granted;	/* pages of the last ALLOC_R */
	struct kvproto_pg granted[N_PAGES];
	uint32_t n_pins;	/* pins taken with kvshm_ledger_pin, still held */
	struct { uint32_t slot, page, gen; } pins[MAX_TRACK];
} peers[MAX_CLIENTS];

struct in {
	const uint8_t *p;
	size_t left;
};

static bool take(struct in *in, void *out, size_t n)
{
	if (in->left < n)
		return false;
	memcpy(out, in->p, n);
	in->p += n;
	in->left -= n;
	return true;
}

static int count_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	int n = 0;

	if (!dir)
		return -1;
	while (readdir(dir))
		n++;
	closedir(dir);
	return n;
}

/* ------------------------------------------------------------ the daemon */

static void remove_spill_file(void)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/kvcached-spill-000.slots", spill_dir);
	unlink(path);
}

static void remove_spill_dir(void)
{
	remove_spill_file();
	rmdir(spill_dir);
}

static void setup_once(void)
{
	struct kvshm_geometry geo = { 0 };
	struct kvshm_header h;
	const char *lv = getenv("KVFUZZ_LOG_LEVEL");

	/* Every log line is formatted (the runs discard stderr). */
	kvd_log_level = lv ? atoi(lv) : KVD_LOG_DEBUG;
	signal(SIGPIPE, SIG_IGN);
	memset(&d, 0, sizeof(d));
	kvd_config_defaults(&d.cfg);
	d.cfg.max_clients = MAX_CLIENTS;
	d.cfg.max_pins = MAX_PINS;
	d.cfg.low_watermark = 10;
	d.cfg.high_watermark = 20;
	d.cfg.tenant_share = 60;
	d.cfg.namespace_share = 70;
	snprintf(d.cfg.tenants[0].name, sizeof(d.cfg.tenants[0].name), "fz");
	memcpy(d.cfg.tenants[0].salt, "fz", 2);
	d.cfg.tenants[0].salt_len = 2;
	d.cfg.tenants[0].share = 40;
	d.cfg.n_tenants = 1;
	d.lfd = d.sigfd = d.tfd = -1;
	d.epfd = epoll_create1(EPOLL_CLOEXEC);
	CHECK(d.epfd >= 0);

	/* The segment is sized for the largest block_tokens an input picks. */
	geo.page_bytes = PAGE_BYTES;
	geo.n_pages = N_PAGES;
	geo.block_tokens = KVSHM_MAX_BLOCK_TOKENS;
	geo.n_buckets = kvshm_buckets_for(N_PAGES);
	geo.max_clients = MAX_CLIENTS;
	geo.max_ns = MAX_NS;
	geo.ledger_slots = MAX_PINS;
	geo.n_slots = N_SLOTS;
	geo.n_buckets = kvshm_buckets_for(N_PAGES + N_SLOTS);
	CHECK(!kvshm_layout(&h, &geo));
	CHECK(!kvd_memfd_create(&seg, "fuzz-segment", h.segment_bytes, KVD_MEM_SMALL));
	snprintf(spill_dir, sizeof(spill_dir), "/dev/shm/kvfuzz-spill.XXXXXX");
	if (!mkdtemp(spill_dir)) {
		snprintf(spill_dir, sizeof(spill_dir), "/tmp/kvfuzz-spill.XXXXXX");
		CHECK(mkdtemp(spill_dir));
	}
	atexit(remove_spill_dir);
	d.seg = seg;

	d.pool.kind = KVSHM_POOL_HOST;
	d.pool.bytes = (uint64_t)N_PAGES * PAGE_BYTES;
	CHECK(!kvd_memfd_create(&d.pool.mem, "fuzz-pool", d.pool.bytes, KVD_MEM_SMALL));

	d.clients = calloc(MAX_CLIENTS, sizeof(*d.clients));
	d.mark = calloc(N_PAGES, 1);
	CHECK(d.clients && d.mark);
	for (int i = 0; i < MAX_CLIENTS; i++)
		peers[i].fd = -1;
}

static void reset(uint32_t bt, bool spill, int eviction)
{
	struct kvshm_geometry geo = { 0 };
	struct kvshm_header h;
	struct kvd keep;

	/* The last input's page records (none are left: it ended with every
	 * page free or READY) go with their table, while its segment says
	 * how many pages there were. */
	kvd_slice_fini(&d);
	keep = d;
	geo.page_bytes = PAGE_BYTES;
	geo.n_pages = N_PAGES;
	geo.block_tokens = bt;
	geo.n_slots = spill ? N_SLOTS : 0;
	geo.n_buckets = kvshm_buckets_for(N_PAGES + geo.n_slots);
	geo.max_clients = MAX_CLIENTS;
	geo.max_ns = MAX_NS;
	geo.ledger_slots = MAX_PINS;
	CHECK(!kvshm_layout(&h, &geo));
	CHECK(h.segment_bytes <= seg.bytes);
	memset(seg.base, 0, h.segment_bytes);
	h.pool_kind = KVSHM_POOL_HOST;
	kvshm_init(seg.base, &h);
	kvd_policy_close(&keep.pol);

	/* Everything else of struct kvd starts from zero, as in main(); what
	 * the last input's daemon allocated for itself goes, as main() frees
	 * it at exit (the pin census's page stamps). */
	free(keep.census_stamp);
	free(keep.qstamp_t);
	free(keep.qstamp_n);
	free(keep.pin_held);
	memset(&d, 0, sizeof(d));
	d.cfg = keep.cfg;
	d.cfg.eviction = eviction;
	CHECK(kvd_policy_open(&d.pol, eviction, N_PAGES) == 0);
	d.seg = keep.seg;
	d.h = seg.base;
	d.pool = keep.pool;
	d.lfd = d.sigfd = d.tfd = -1;
	kvd_ground_bind(&d);
	d.g.host = &kvd_core_tier_host;
	d.epfd = keep.epfd;
	d.clients = keep.clients;
	d.mark = keep.mark;
	memset(d.clients, 0, MAX_CLIENTS * sizeof(*d.clients));
	d.low_pages = (uint32_t)((uint64_t)N_PAGES * d.cfg.low_watermark / 100);
	d.high_pages = (uint32_t)((uint64_t)N_PAGES * d.cfg.high_watermark / 100);
	kvd_quota_configure(&d);
	/* Pages several ranks write: given up at the next TICK unless whole
	 * (ranks join between two ticks). */
	CHECK(kvd_slice_init(&d) == 0);
	d.cfg.slice_timeout_ms = 0;
	spill_on = spill;
	if (spill) {
		/* A fresh area every input: nothing carries over between runs. */
		remove_spill_file();
		snprintf(d.cfg.spill_dir, sizeof(d.cfg.spill_dir), "%s", spill_dir);
		d.cfg.spill_size = (uint64_t)N_SLOTS * (kvd_slot_hdr_bytes(bt) + PAGE_BYTES);
		d.cfg.spill_io = KVD_SIO_SYNC;
		CHECK(kvd_spill_open(&d.g) == 0);
		CHECK(kvd_tier_state(&d.g, KVD_TIER_SPILL));
	}
}

static void check_state(void);

/* After an operation: what the main loop does when the spill eventfd
 * fires (every write and read already done, with inline I/O), then the
 * checks. */
static void step_done(void)
{
	kvd_tiers_reap(&d.g, KVD_TIER_SPILL);
	kvd_server_drop_closing(&d);	/* as the loop does after each event */
	check_state();
}

/* do_accept for a connection of our own making. */
static struct kvd_client *accept_client(bool with_pidfd)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
	struct kvd_client *c = NULL;
	struct peer *pr;
	uint32_t i;
	int sv[2];

	for (i = 0; i < d.cfg.max_clients; i++) {
		if (!d.clients[i].used) {
			c = &d.clients[i];
			break;
		}
	}
	if (!c)
		return NULL;	/* the daemon refuses: max-clients */
	CHECK(peers[i].fd < 0);
	CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv));
	memset(c, 0, sizeof(*c));
	c->used = true;
	c->id = i;
	c->fd = sv[0];
	c->pidfd = with_pidfd ? (int)syscall(SYS_pidfd_open, getpid(), 0) : -1;
	c->pid = getpid();
	c->uid = geteuid();
	c->gid = getegid();
	c->ledger.fd = -1;
	ev.data.u64 = KVD_EV_CLIENT + i;
	CHECK(!epoll_ctl(d.epfd, EPOLL_CTL_ADD, sv[0], &ev));
	d.n_clients++;
	pr = &peers[i];
	pr->fd = sv[1];
	pr->dfd = sv[0];
	pr->rx_len = 0;
	pr->eof = false;
	pr->n_granted = 0;
	pr->n_pins = 0;
	return c;
}

/* ------------------------------------------------------------ our side */

static void drain(struct peer *pr)
{
	for (;;) {
		char cbuf[CMSG_SPACE(sizeof(int) * 8)];
		struct iovec iov = { pr->rx + pr->rx_len, RX_BYTES - pr->rx_len };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
				     .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *cm;
		ssize_t n;

		CHECK(pr->rx_len < RX_BYTES);	/* replies are small here */
		n = recvmsg(pr->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		for (cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm)) {
			int k, cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			for (k = 0; cm->cmsg_type == SCM_RIGHTS && k < cnt; k++) {
				int f;

				memcpy(&f, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
				close(f);
			}
		}
		if (n > 0) {
			pr->rx_len += (size_t)n;
			continue;
		}
		if (n == 0)
			pr->eof = true;
		else
			CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
		return;
	}
}

/* The request a reply answers, as far as the checks need it. */
struct req {
	bool sent;		/* a frame went to this row in this operation */
	bool bye;
	uint16_t type;		/* 0 if kvproto_decode refused it */
	uint32_t seq;
	uint32_t n;		/* records (ALLOC: pages asked for) */
};

/* Every reply the daemon sent this row since the last operation. */
NO_COVERAGE static void check_replies(uint32_t row, const struct req *rq)
{
	struct peer *pr = &peers[row];
	const struct kvd_client *c = &d.clients[row];
	const struct kvshm_page *pages = kvshm_pages(d.h);
	size_t off = 0;
	int frames = 0;

	while (off < pr->rx_len) {
		struct kvproto_hdr h;
		const uint8_t *p;

		CHECK(pr->rx_len - off >= sizeof(h));
		memcpy(&h, pr->rx + off, sizeof(h));
		CHECK(pr->rx_len - off - sizeof(h) >= h.len);
		p = pr->rx + off + sizeof(h);
		off += sizeof(h) + h.len;
		frames++;
		/* What the daemon sends passes the decoder the client runs. */
		CHECK(!kvproto_decode(&h, h.len ? p : NULL, d.h->geo.block_tokens, NULL));
		CHECK(rq->sent && !rq->bye && h.seq == rq->seq);
		switch (h.type) {
		case KVPROTO_ERROR: {
			struct kvproto_error e;

			memcpy(&e, p, sizeof(e));
			CHECK(e.err < 0 && e.fatal <= 1);
			/* Single flight's refusal: only there, and no hang-up. */
			CHECK(e.err != -EINPROGRESS || (rq->type == KVPROTO_ALLOC_KEYS && !e.fatal));
			if (e.fatal)	/* the daemon hangs up after a fatal error */
				CHECK(!c->used || c->lingering);
			break;
		}
		case KVPROTO_HELLO_R: {
			struct kvproto_hello_r r;

			CHECK(rq->type == KVPROTO_HELLO && kvd_live(c));
			memcpy(&r, p, sizeof(r));
			CHECK(r.client_id == row && r.ns_id == c->ns_id && r.nslots == c->nslots);
			CHECK(r.n_pages == N_PAGES && r.block_tokens == d.h->geo.block_tokens);
			CHECK(r.ns_page_bytes <= r.page_bytes);
			break;
		}
		case KVPROTO_ALLOC_R: {
			struct kvproto_count cnt;
			uint32_t i;

			CHECK(rq->type == KVPROTO_ALLOC || rq->type == KVPROTO_ALLOC_KEYS);
			memcpy(&cnt, p, sizeof(cnt));
			CHECK(cnt.n <= rq->n && cnt.n <= N_PAGES);
			pr->n_granted = cnt.n;
			for (i = 0; i < cnt.n; i++) {
				struct kvproto_pg pg;

				memcpy(&pg, p + sizeof(cnt) + i * sizeof(pg), sizeof(pg));
				CHECK(pg.page < N_PAGES);
				CHECK(atomic_load(&pages[pg.page].state) == KVSHM_PAGE_WRITING);
				/* Its own, or (a rank writing a slice) one it
				 * holds a slice of. */
				CHECK(pages[pg.page].owner == kvd_owner(c) ||
				      (kvd_slicing(c) && kvd_slice_holds(&d, c, pg.page)));
				CHECK(atomic_load(&pages[pg.page].gen) == pg.gen);
				CHECK(!d.mark[pg.page]);	/* no page twice */
				d.mark[pg.page] = 1;
				pr->granted[i] = pg;
			}
			for (i = 0; i < cnt.n; i++)
				d.mark[pr->granted[i].page] = 0;
			break;
		}
		case KVPROTO_PUBLISH_R: {
			struct kvproto_count cnt;
			uint32_t i;

			CHECK(rq->type == KVPROTO_PUBLISH);
			memcpy(&cnt, p, sizeof(cnt));
			CHECK(cnt.n == rq->n);
			for (i = 0; i < cnt.n; i++) {
				struct kvproto_pub_r r;

				memcpy(&r, p + sizeof(cnt) + i * sizeof(r), sizeof(r));
				CHECK(r.status == KVSHM_PUBLISHED || r.status == KVSHM_PUBLISH_DUP ||
				      r.status == -EEXIST || r.status == -ENOSPC ||
				      /* a slice in; a page given up, or punched */
				      (kvd_slicing(c) && (r.status == KVPROTO_PUB_SLICE ||
							  r.status == -ESTALE || r.status == -EIO)));
				if (r.status >= 0)
					CHECK(r.page < N_PAGES);
			}
			break;
		}
		case KVPROTO_FREE_R: {
			struct kvproto_count cnt;

			CHECK(rq->type == KVPROTO_FREE);
			memcpy(&cnt, p, sizeof(cnt));
			CHECK(cnt.n == rq->n);
			break;
		}
		case KVPROTO_STAT_R:
			CHECK(rq->type == KVPROTO_STAT && !c->used);
			break;
		case KVPROTO_RESET_R:
			/* Served, then closed; this target is root (or the
			 * daemon's own user): never refused for who it is. */
			CHECK(rq->type == KVPROTO_RESET && !c->used);
			reset_seen = true;
			break;
		case KVPROTO_DROP_R: {
			struct kvproto_drop_r r;

			CHECK(rq->type == KVPROTO_DROP && kvd_live(c));
			memcpy(&r, p, sizeof(r));
			CHECK(r.dropped <= N_PAGES && r.left <= N_PAGES && r.slots <= N_SLOTS);
			break;
		}
		case KVPROTO_ADMIN_R: {
			struct kvproto_admin_r r;

			/* Served, then closed; this target is the daemon's user. */
			CHECK(rq->type == KVPROTO_ADMIN && !c->used);
			memcpy(&r, p, sizeof(r));
			CHECK(r.dropped <= N_PAGES && r.left <= N_PAGES && r.slots <= N_SLOTS);
			CHECK(r.resident <= r.blocks && r.blocks <= KVPROTO_PIN_BLOCKS);
			break;
		}
		case KVPROTO_PIN_R: {
			struct kvproto_pin_r r;

			CHECK(rq->type == KVPROTO_PIN && kvd_live(c));
			memcpy(&r, p, sizeof(r));
			CHECK(r.id && r.blocks == rq->n && r.resident <= r.blocks);
			break;
		}
		case KVPROTO_UNPIN_R:
			CHECK(rq->type == KVPROTO_UNPIN && kvd_live(c));
			break;
		case KVPROTO_RESTORE_R:
		case KVPROTO_FETCH_R: {
			struct kvproto_count cnt;
			uint32_t i;

			CHECK(rq->type == (h.type == KVPROTO_FETCH_R ? KVPROTO_FETCH : KVPROTO_RESTORE));
			memcpy(&cnt, p, sizeof(cnt));
			CHECK(cnt.n == rq->n);
			/* Nothing damages a slot here: never -EBADMSG; no spill
			 * tier: a key is in the pool or nowhere. */
			for (i = 0; i < cnt.n; i++) {
				int32_t st;

				memcpy(&st, p + sizeof(cnt) + i * sizeof(st), sizeof(st));
				CHECK(st == 0 || st == -ENOENT || (spill_on && st == -ENOSPC));
			}
			break;
		}
		default:
			CHECK(0);	/* the daemon sent a request type */
		}
	}
	CHECK(frames <= 1);	/* exactly one reply per request, at most */
	/* Every well-formed request but BYE gets its reply. */
	if (rq->sent && !rq->bye && rq->type)
		CHECK(frames == 1);
	pr->rx_len = 0;
}

static void forget_client(struct peer *pr)
{
	if (pr->fd >= 0)
		close(pr->fd);
	pr->fd = -1;
	pr->rx_len = 0;
	pr->n_granted = 0;
}

/* After every operation: read replies; close what the daemon closed. */
static void pump(int target, const struct req *rq)
{
	static const struct req none;
	uint32_t i;

	/* The daemon closes client connections on its closer threads
	 * (closer.h): let them finish before looking for the hang-up. */
	CHECK(kvd_closer_flush(10000));
	for (i = 0; i < MAX_CLIENTS; i++) {
		struct peer *pr = &peers[i];
		struct kvd_client *c = &d.clients[i];
		bool live;

		if (!kvd_pins_count(c) || !c->used)
			pr->n_pins = 0;	/* its ledger (and pins) are gone */
		if (pr->fd < 0)
			continue;
		drain(pr);
		check_replies(i, (int)i == target ? rq : &none);
		live = c->used && !c->lingering && c->fd == pr->dfd;
		CHECK(live == !pr->eof);	/* closed exactly when dropped */
		if (!live)
			forget_client(pr);
	}
}

/* ------------------------------------------------------------ invariants */

NO_COVERAGE static void check_state(void)
{
	const struct kvshm_header *h = d.h;
	const struct kvshm_page *pages = kvshm_pages(h);
	const struct kvshm_free *fr = kvshm_free(h);
	const struct kvshm_stats *st = kvshm_stats(h);
	const struct kvshm_ns *ns = kvshm_ns(h);
	const struct kvshm_top *top = kvshm_top(h);
	uint32_t n = h->geo.n_pages, nb = h->geo.n_buckets;
	uint32_t count[5] = { 0 }, owned[MAX_CLIENTS] = { 0 }, refs[N_PAGES] = { 0 };
	uint32_t spill[1024] = { 0 }, slot_refs[N_SLOTS] = { 0 }, spilled = 0, flying = 0;
	uint32_t ns_slots = h->geo.n_slots;
	uint8_t seen[N_PAGES] = { 0 };
	uint32_t i, j, used = 0, live = 0, not_hello = 0, entries = 0;

	CHECK(n == N_PAGES && nb <= 1024 && ns_slots <= N_SLOTS);
	for (i = 0; i < n; i++) {
		uint32_t s = atomic_load(&pages[i].state);

		CHECK(!d.mark[i]);	/* message scratch is clean between messages */
		CHECK(s <= KVSHM_PAGE_EVICTING);
		count[s]++;
		if (s == KVSHM_PAGE_WRITING && kvd_slice_is(&d, i)) {
			/* Written by several ranks: each open slice is its
			 * rank's (the rank that began it may have left). */
			uint32_t who[KVSHM_MAX_WRITERS], k, m = kvd_slice_open(&d, i, who);

			for (k = 0; k < m; k++) {
				CHECK(who[k] >= 1 && who[k] <= MAX_CLIENTS);
				CHECK(kvd_pins_count(&d.clients[who[k] - 1]));
				CHECK(kvd_slicing(&d.clients[who[k] - 1]));
				CHECK(pages[i].ns_id == d.clients[who[k] - 1].ns_id);
				owned[who[k] - 1]++;
			}
		} else if (s == KVSHM_PAGE_WRITING) {
			uint32_t o = pages[i].owner;
			const struct kvd_client *c;

			CHECK(!atomic_load(&pages[i].writers));
			CHECK(o >= 1 && o <= MAX_CLIENTS);
			c = &d.clients[o - 1];
			/* Only a client that said HELLO and still counts holds one. */
			CHECK(kvd_pins_count(c));
			CHECK(pages[i].ns_id == c->ns_id);
			owned[o - 1]++;
		} else {
			CHECK(pages[i].owner == 0);
			CHECK(!atomic_load(&pages[i].flight));	/* only WRITING flies */
		}
		if (s == KVSHM_PAGE_READY) {
			CHECK(pages[i].ns_id < h->geo.max_ns);
			CHECK(atomic_load(&ns[pages[i].ns_id].used));
		}
		/* The eviction policy holds exactly the READY pages: every
		 * path into and out of READY told it. */
		CHECK(kvd_policy_held(&d.pol, i) == (s == KVSHM_PAGE_READY));
	}
	CHECK(d.pol.held == count[KVSHM_PAGE_READY]);
	/* Nothing stays EVICTING between messages (no spill tier here). */
	CHECK(count[KVSHM_PAGE_EVICTING] == 0);
	CHECK(count[KVSHM_PAGE_FREE] + count[KVSHM_PAGE_WRITING] + count[KVSHM_PAGE_READY] == n);

	/* The free stack holds exactly the FREE pages, once each. */
	CHECK(fr->count == count[KVSHM_PAGE_FREE]);
	for (i = 0; i < fr->count; i++) {
		uint32_t p = fr->page[i];

		CHECK(p < n && !seen[p]);
		CHECK(atomic_load(&pages[p].state) == KVSHM_PAGE_FREE);
		seen[p] = 1;
	}

	/* Index: every entry names a READY page, or a SPILLED slot, with its
	 * key, inside the probe window of the key's home bucket; spill hints
	 * count exactly the entries living away from home. */
	for (i = 0; i < nb; i++) {
		const struct kvshm_bucket *b = &kvshm_buckets(h)[i];

		CHECK((atomic_load(&b->seq) & 1) == 0);
		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++) {
			const struct kvshm_entry *e = &b->e[j];
			uint32_t p, home, dist;

			if (!e->ref) {
				CHECK(!e->tag && !e->check);
				continue;
			}
			p = e->ref - 1;
			if (kvshm_loc_is_slot(p)) {
				const struct kvshm_slot *s;

				p &= ~KVSHM_LOC_SLOT;
				CHECK(p < ns_slots);
				s = &kvshm_slots(h)[p];
				CHECK(atomic_load(&s->state) == KVSHM_SLOT_SPILLED);
				CHECK(e->tag == s->key.lo && e->check == (uint32_t)s->key.hi);
				CHECK(s->ns_id < h->geo.max_ns && atomic_load(&ns[s->ns_id].used));
				home = kvshm_index_home(h, s->key);
				dist = (i - home) & (nb - 1);
				CHECK(dist < KVSHM_PROBE_MAX);
				if (dist)
					spill[home]++;
				slot_refs[p]++;
				entries++;
				continue;
			}
			CHECK(p < n);
			/* A READY page, or a WRITING one announced in flight. */
			CHECK(atomic_load(&pages[p].state) == KVSHM_PAGE_READY ||
			      (atomic_load(&pages[p].state) == KVSHM_PAGE_WRITING &&
			       atomic_load(&pages[p].flight)));
			CHECK(e->tag == pages[p].key.lo && e->check == (uint32_t)pages[p].key.hi);
			home = kvshm_index_home(h, pages[p].key);
			dist = (i - home) & (nb - 1);
			CHECK(dist < KVSHM_PROBE_MAX);
			if (dist)
				spill[home]++;
			refs[p]++;
			entries++;
		}
	}
	for (i = 0; i < nb; i++)
		CHECK(kvshm_buckets(h)[i].spill == spill[i]);
	for (i = 0; i < n; i++) {
		if (atomic_load(&pages[i].flight)) {
			/* In flight: indexed once, under the announced key. */
			CHECK(refs[i] == 1);
			CHECK(kvshm_index_find(h, pages[i].key) == i);
			flying++;
			continue;
		}
		if (atomic_load(&pages[i].state) != KVSHM_PAGE_READY) {
			CHECK(refs[i] == 0);
			continue;
		}
		CHECK(refs[i] == 1);
		/* A lookup reaches something for it (another page with the same
		 * tag and check may shadow it: a crafted collision, a miss). */
		CHECK(kvshm_index_find(h, pages[i].key) != UINT32_MAX);
	}
	/* Slots: SPILLED exactly when the index names them, once. */
	for (i = 0; i < ns_slots; i++) {
		uint32_t s = atomic_load(&kvshm_slots(h)[i].state);

		CHECK(s <= KVSHM_SLOT_BACKING && s != KVSHM_SLOT_BUSY);	/* none between ops */
		CHECK(slot_refs[i] == (s == KVSHM_SLOT_SPILLED));
		spilled += s == KVSHM_SLOT_SPILLED;
	}
	CHECK(entries == count[KVSHM_PAGE_READY] + spilled + flying);
	CHECK(st->pages_in_flight == flying);
	CHECK(st->flights >= flying);
	/* Nobody is left to wake between messages. */
	CHECK(d.n_flight_wake == 0 && !d.flight_wake_all);

	/* Statistics match the table, and pages are conserved. */
	CHECK(st->pages_free == count[KVSHM_PAGE_FREE]);
	CHECK(st->pages_writing == count[KVSHM_PAGE_WRITING]);
	CHECK(st->pages_ready == count[KVSHM_PAGE_READY]);
	CHECK(st->index_entries == count[KVSHM_PAGE_READY] + spilled);
	CHECK(st->pages_spilled == spilled);
	if (reset_seen) {
		reset_seen = false;
		base_ready = count[KVSHM_PAGE_READY];
		base_writing = count[KVSHM_PAGE_WRITING];
		CHECK(st->allocs == 0 && st->publishes == 0 && st->evictions == 0 &&
		      st->lookups == 0 && st->hit_tokens == 0 && st->reset_time_ns);
		CHECK(top->n == 0);
	}
	CHECK(st->allocs + base_writing == st->publishes + st->publish_dups + st->publish_refused +
			    st->frees + st->reclaimed + st->slice_dropped +
			    count[KVSHM_PAGE_WRITING]);
	/* A READY page was published or restored; it leaves by eviction
	 * (to a slot or not). */
	CHECK(st->publishes + st->restores + base_ready == st->evictions + count[KVSHM_PAGE_READY]);
	/* Nothing here damages a slot: none fails its checks. */
	CHECK(st->spill_dropped == 0 && st->spill_errors == 0);
	CHECK(!spill_on || st->spill_slots == N_SLOTS);

	/* Client rows. */
	for (i = 0; i < MAX_CLIENTS; i++) {
		const struct kvd_client *c = &d.clients[i];
		const struct kvshm_client_row *row = &kvshm_clients(h)[i];

		if (!c->used) {
			CHECK(owned[i] == 0 && row->pid == 0);
			continue;
		}
		used++;
		CHECK(c->id == i);
		CHECK(c->writing == owned[i]);
		CHECK(c->writing <= c->nslots);
		CHECK(!c->lingering || c->hello);
		if (kvd_live(c))
			live++;
		not_hello += !c->hello;
		CHECK((row->pid != 0) == kvd_live(c));
		if (c->hello) {
			CHECK(c->l && c->nslots >= 1 && c->nslots <= MAX_PINS);
			CHECK(c->bt == h->geo.block_tokens);
			CHECK(c->ns_id < h->geo.max_ns && atomic_load(&ns[c->ns_id].used));
		}
		CHECK(c->lingering ? c->fd < 0 : c->fd >= 0);
	}
	CHECK(d.n_clients == used);
	CHECK(st->clients_attached == live);
	CHECK(st->clients_lingering == used - live - not_hello);

	/* Namespace rows: what HELLO checked, still so; their statistics
	 * count no more pages and clients than there are. */
	{
		uint64_t pages_sum = 0, clients_sum = 0;

		for (i = 0; i < h->geo.max_ns; i++) {
			pages_sum += kvshm_ns_stats(h)[i].pages;
			clients_sum += kvshm_ns_stats(h)[i].clients;
			CHECK(kvshm_ns_stats(h)[i].dropped <= st->evictions);
		}
		CHECK(pages_sum <= N_PAGES && clients_sum <= MAX_CLIENTS);
	}
	for (i = 0; i < h->geo.max_ns; i++) {
		if (!atomic_load(&ns[i].used))
			continue;
		CHECK(memchr(ns[i].model, 0, sizeof(ns[i].model)) && ns[i].model[0]);
		CHECK(ns[i].block_tokens == h->geo.block_tokens);
		CHECK(ns[i].page_bytes && ns[i].page_bytes <= h->geo.page_bytes);
	}

	/* The top sketch: what kvstat prints must be printable. */
	CHECK((atomic_load(&top->seq) & 1) == 0 && top->n <= KVSHM_TOP);
	for (i = 0; i < top->n; i++) {
		const char *l = top->e[i].label;

		CHECK(memchr(l, 0, KVSHM_LABEL));
		for (j = 0; l[j]; j++)
			CHECK(l[j] >= 0x20 && l[j] <= 0x7e);
		CHECK(top->e[i].err <= top->e[i].hit_tokens);
	}

	/* Prefix pins: each page's hold count is the pins that hold it,
	 * every held page READY in its pin's namespace; the pins' pages are
	 * in the stats and in their tenants' and namespaces' accounts. */
	{
		uint32_t held[N_PAGES] = { 0 }, t, k;
		uint64_t tp[KVSHM_TENANTS] = { 0 }, np[KVD_MAX_NS] = { 0 }, resident = 0, pins = 0;
		uint64_t tw[KVSHM_TENANTS] = { 0 }, nw[KVD_MAX_NS] = { 0 };
		uint32_t tc[KVSHM_TENANTS] = { 0 }, nc[KVD_MAX_NS] = { 0 };
		uint64_t tpages[KVSHM_TENANTS] = { 0 };

		for (i = 0; i < KVSHM_PINNED; i++) {
			const struct kvd_pin *pn = &d.pins[i];
			const struct kvshm_pinned *row = &kvshm_pinned(h)[i];

			CHECK(atomic_load(&row->id) == pn->id);
			if (!pn->id)
				continue;
			pins++;
			CHECK(pn->resident <= pn->n && pn->n <= KVPROTO_PIN_BLOCKS);
			CHECK(atomic_load(&row->resident) == pn->resident);
			CHECK(pn->tenant < KVSHM_TENANTS && pn->ns_id < h->geo.max_ns);
			for (k = 0; k < pn->resident; k++) {
				uint32_t p = pn->page[k];

				CHECK(p < n && atomic_load(&pages[p].state) == KVSHM_PAGE_READY);
				CHECK(pages[p].ns_id == pn->ns_id && kvshm_key_eq(pages[p].key, pn->keys[k]));
				held[p]++;
			}
			resident += pn->resident;
			tp[pn->tenant] += pn->resident;
			np[pn->ns_id] += pn->resident;
		}
		for (i = 0; i < n; i++)
			CHECK((d.pin_held ? d.pin_held[i] : 0) == held[i]);
		CHECK(st->pinned_pages == resident && st->pinned_prefixes == pins);
		for (i = 0; i < MAX_CLIENTS; i++) {
			const struct kvd_client *c = &d.clients[i];

			if (!c->used || !c->hello)
				continue;
			CHECK(c->tenant < KVSHM_TENANTS && d.tenants[c->tenant].used);
			tw[c->tenant] += c->writing;
			tc[c->tenant]++;
			nw[c->ns_id] += c->writing;
			nc[c->ns_id]++;
		}
		for (i = 0; i < n; i++) {
			uint32_t sti = atomic_load(&pages[i].state);

			t = pages[i].tenant;
			CHECK(t < KVSHM_TENANTS || t == KVSHM_TENANT_NONE);
			if (t < KVSHM_TENANTS && (sti == KVSHM_PAGE_READY || sti == KVSHM_PAGE_EVICTING))
				tpages[t]++;
		}
		for (t = 0; t < KVSHM_TENANTS; t++) {
			const struct kvshm_tenant *row = &kvshm_tenants(h)[t];

			CHECK((atomic_load(&row->used) != 0) == d.tenants[t].used);
			CHECK(d.tgrp[t].writing == tw[t] && d.tgrp[t].clients == tc[t]);
			CHECK(d.tgrp[t].pinned == tp[t]);
			CHECK(row->pages == tpages[t]);
			CHECK(memchr(row->name, 0, sizeof(row->name)));
		}
		for (i = 0; i < KVD_MAX_NS && i < h->geo.max_ns; i++)
			CHECK(d.ngrp[i].writing == nw[i] && d.ngrp[i].clients == nc[i] &&
			      d.ngrp[i].pinned == np[i]);
	}

	/* A page this target pinned (and still holds pinned) never left. */
	for (i = 0; i < MAX_CLIENTS; i++) {
		const struct kvd_client *c = &d.clients[i];
		struct peer *pr = &peers[i];

		for (j = 0; j < pr->n_pins; j++) {
			uint64_t v = atomic_load(&c->l->slot[pr->pins[j].slot]);
			uint32_t p = pr->pins[j].page;

			CHECK(v == kvshm_slot_pack(p, pr->pins[j].gen));
			CHECK(atomic_load(&pages[p].state) == KVSHM_PAGE_READY);
			CHECK(atomic_load(&pages[p].gen) == pr->pins[j].gen);
		}
	}
}

/* ------------------------------------------------------------ /metrics */

/*
 * 1: the page must be valid UTF-8. This target found that it is not when
 * a client's model or process name is not (shm/stats.c's put_escaped
 * copies bytes as they are; regress/daemon_frames/metrics-utf8-*): set to
 * 1 together with that fix, so that those inputs guard it from then on.
 */
#ifndef KVFUZZ_METRICS_UTF8
#define KVFUZZ_METRICS_UTF8 1
#endif

static bool name_char(char ch, bool first)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch == ':' ||
	       (!first && ch >= '0' && ch <= '9');
}

/*
 * The Prometheus text format (0.0.4) as a scraper parses it: "# HELP" and
 * "# TYPE" lines, and samples `name{label="value",...} number`, label
 * values with only \\, \" and \n escapes, and everything valid UTF-8 (a
 * scraper refuses the whole page otherwise). What a client chose (its
 * model name, its process name) must not break the page for everyone.
 */
NO_COVERAGE static void check_prometheus(const char *t, size_t len)
{
	const char *p = t, *end = t + len;

	CHECK(strlen(t) == len && len && end[-1] == '\n');
	for (size_t i = 0; KVFUZZ_METRICS_UTF8 && i < len;) {
		int n = kvt_utf8_len((const unsigned char *)t + i);

		CHECK(n > 0);
		i += (size_t)n;
	}
	while (p < end) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		char *num_end;

		CHECK(eol);
		if (*p == '#') {
			CHECK(!strncmp(p, "# HELP ", 7) || !strncmp(p, "# TYPE ", 7));
			p = eol + 1;
			continue;
		}
		CHECK(name_char(*p, true));
		while (name_char(*p, false))
			p++;
		if (*p == '{') {
			p++;
			while (*p != '}') {
				CHECK(name_char(*p, true) && *p != ':');
				while (name_char(*p, false) && *p != ':')
					p++;
				CHECK(p[0] == '=' && p[1] == '"');
				for (p += 2; *p != '"'; p++) {
					CHECK(p < eol);
					if (*p == '\\') {
						p++;
						CHECK(*p == '\\' || *p == '"' || *p == 'n');
					}
				}
				p++;
				CHECK(*p == ',' || *p == '}');
				if (*p == ',')
					p++;
			}
			p++;
		}
		CHECK(*p == ' ');
		p++;
		strtod(p, &num_end);
		CHECK(num_end > p && num_end == eol);
		p = eol + 1;
	}
}

/* What /metrics would serve now (metrics.c renders exactly this). */
NO_COVERAGE static void check_metrics(void)
{
	struct kvshm_snap snap;
	size_t need;
	char *text;

	CHECK(!kvshm_snap_take(d.h, &snap));
	need = kvshm_prometheus(&snap, NULL, 0);
	text = malloc(need + 1);
	CHECK(text);
	CHECK(kvshm_prometheus(&snap, text, need + 1) == need);
	check_prometheus(text, need);
	free(text);
	kvshm_snap_free(&snap);
}

/* ------------------------------------------------------------ operations */

enum op {
	OP_FRAME_FIRST = 0, OP_FRAME_LAST = 6,
	OP_FIX_FIRST = 7, OP_FIX_LAST = 8,
	OP_TICK = 9,
	OP_HANGUP = 10,
	OP_PIN = 11,
	OP_LEDGER = 12,
	OP_TOUCH = 13,
	OP_HIT = 14,
	OP_EXIT = 15,
};

/* A live row for a frame: row `want` if connected, else a new client. */
static struct kvd_client *frame_client(uint32_t want, bool with_pidfd)
{
	struct kvd_client *c = &d.clients[want];

	if (c->used && !c->lingering)
		return c;
	return accept_client(with_pidfd);
}

/*
 * A (key, parent) pair at r, `gap` bytes apart: when the key's low byte
 * says so (1 or 2 mod 4), replace it with the identity of a page in flight
 * or cached now (picked by the key's high byte), so that announcements
 * meet blocks that are taken, and publishes meet announcements.
 */
static void fix_identity(uint8_t *r, size_t gap)
{
	const struct kvshm_page *pages = kvshm_pages(d.h);
	uint32_t pick[N_PAGES], np = 0, i, want;
	struct kvshm_key k;

	memcpy(&k, r, sizeof(k));
	want = (uint32_t)(k.lo & 3);
	if (want != 1 && want != 2)
		return;
	for (i = 0; i < N_PAGES; i++) {
		uint32_t st = atomic_load(&pages[i].state);

		if (want == 1 ? st == KVSHM_PAGE_WRITING && atomic_load(&pages[i].flight) :
				st == KVSHM_PAGE_READY)
			pick[np++] = i;
	}
	if (!np)
		return;
	i = pick[(k.hi >> 56) % np];
	memcpy(r, &pages[i].key, sizeof(k));
	memcpy(r + gap, &pages[i].parent, sizeof(k));
}

/*
 * A PUBLISH record's identity: the daemon refuses a key that is not the
 * XXH3 of the record's parent, tokens and extra digest (issue #24), which
 * fuzzed bytes never are. So, by the extra digest's low bits: leave the
 * record as it came (refused, and the client dropped); point it at a page
 * in flight or cached (fix_identity) and take that page's tokens too, so
 * it is the same block (a duplicate, or the takeover of an announcement);
 * or keep its tokens and parent and give it the key they make under the
 * client's root (a new block, or a collision with whatever the index
 * holds there; with no extra keys when the digest's high half is zero).
 */
static void fix_key(uint8_t *r, struct kvshm_key root)
{
	const uint32_t bt = d.h->geo.block_tokens;
	struct kvproto_pub pub;
	uint32_t tokens[KVSHM_MAX_BLOCK_TOKENS], i;
	struct kvshm_key k;

	memcpy(&pub, r, sizeof(pub));
	switch (pub.extra.lo & 3) {
	case 0:
		return;
	case 1:
		fix_identity(r + offsetof(struct kvproto_pub, key), sizeof(struct kvshm_key));
		memcpy(&k, r + offsetof(struct kvproto_pub, key), sizeof(k));
		for (i = 0; i < N_PAGES; i++)
			if (kvshm_pages(d.h)[i].key.lo == k.lo && kvshm_pages(d.h)[i].key.hi == k.hi) {
				memcpy(r + sizeof(pub), kvshm_tokens(d.h, i), (size_t)bt * 4);
				break;
			}
		memset(r + offsetof(struct kvproto_pub, extra), 0, sizeof(struct kvshm_key));
		return;
	default:
		if ((pub.extra.lo & 3) == 3)
			fix_identity(r + offsetof(struct kvproto_pub, key), sizeof(struct kvshm_key));
		memcpy(&pub, r, sizeof(pub));
		/* A digest whose high half is zero asked for this mode only:
		 * no extra keys, as an operator's pin computes them. */
		if (!pub.extra.hi)
			pub.extra.lo = 0;
		memcpy(tokens, r + sizeof(pub), (size_t)bt * 4);
		pub.key = kvshm_key_block(root, pub.parent, tokens, bt, pub.extra);
		memcpy(r, &pub, sizeof(pub));
		return;
	}
}

/*
 * A claim whose key's low bits are 3 gets the key a PUBLISH record of the
 * same parent, tokens tok..tok + bt - 1 (tok: the key's high word) and
 * extra digest {2, 0} is given by fix_key under the client's root: so that ranks that claim a
 * block (each its slice) can then publish it under the key they claimed,
 * as the daemon demands. True if it did.
 */
static bool fix_claim_key(uint8_t *r, struct kvshm_key root)
{
	const uint32_t bt = d.h->geo.block_tokens;
	uint32_t tokens[KVSHM_MAX_BLOCK_TOKENS], i;
	struct kvproto_claim cl;

	memcpy(&cl, r, sizeof(cl));
	if ((cl.key.lo & 3) != 3)
		return false;
	for (i = 0; i < bt; i++)
		tokens[i] = (uint32_t)cl.key.hi + i;
	cl.key = kvshm_key_block(root, cl.parent, tokens, bt, (struct kvshm_key){ 2, 0 });
	memcpy(r, &cl, sizeof(cl));
	return true;
}

/*
 * Up to n records `stride` bytes apart made a chain of cached blocks:
 * record i's key the key of a READY page whose parent is record i-1's (the
 * first's: root), picked among such pages by the record's low byte; its
 * tokens copied to tok + i * bt when tok is given. Stops where no page
 * continues the chain (the rest stay as they came).
 */
static void fix_chain(uint8_t *r, size_t n, size_t stride, struct kvshm_key root, uint32_t *tok)
{
	const struct kvshm_page *pages = kvshm_pages(d.h);
	const uint32_t bt = d.h->geo.block_tokens;
	struct kvshm_key parent = root, k;
	uint32_t pick[N_PAGES], np, p;
	size_t i;

	for (i = 0; i < n; i++) {
		for (p = 0, np = 0; p < N_PAGES; p++)
			if (atomic_load(&pages[p].state) == KVSHM_PAGE_READY &&
			    kvshm_key_eq(pages[p].parent, parent))
				pick[np++] = p;
		if (!np)
			return;
		memcpy(&k, r + i * stride, sizeof(k));
		p = pick[k.lo % np];
		memcpy(r + i * stride, &pages[p].key, sizeof(k));
		if (tok)
			memcpy(tok + i * bt, kvshm_tokens(d.h, p), (size_t)bt * 4);
		parent = pages[p].key;
	}
}

/* An ADMIN's names made real: the model of a namespace in use (by its
 * ns_row), the tenant "" or "fz" (by its label's first byte); to pin, its
 * tokens those of a chain of cached blocks of that key space. */
static void fix_admin(uint8_t *p, uint32_t len)
{
	const uint32_t bt = d.h->geo.block_tokens;
	struct kvproto_admin q;
	const struct kvshm_ns *ns;
	struct kvshm_key root;
	size_t n;

	memcpy(&q, p, sizeof(q));
	ns = &kvshm_ns(d.h)[q.ns_row % MAX_NS];
	if (!atomic_load(&ns->used))
		return;
	memcpy(q.model, ns->model, sizeof(q.model));
	q.model[sizeof(q.model) - 1] = 0;
	if (q.label[0] & 1)
		q.ns_row = KVPROTO_ADMIN_ANY;
	snprintf(q.tenant, sizeof(q.tenant), "%s", q.label[0] & 2 ? "fz" : "");
	memcpy(p, &q, sizeof(q));
	if (q.op != KVPROTO_ADMIN_PIN || q.n_tokens < bt)
		return;
	root = kvshm_key_root(ns->id, q.tenant[0] ? "fz" : NULL, q.tenant[0] ? 2 : 0);
	n = (len - sizeof(q)) / 4 / bt;
	{
		uint8_t *keys = calloc(n ? n : 1, sizeof(struct kvshm_key));

		CHECK(keys);
		fix_chain(keys, n, sizeof(struct kvshm_key), root, (uint32_t *)(void *)(p + sizeof(q)));
		free(keys);
	}
}

/* Replace record (page, gen) pairs with ones the daemon granted. */
static void fix_records(struct peer *pr, struct kvshm_key root, const struct kvproto_hdr *h,
			uint8_t *p)
{
	struct kvshm_key prev_was = { 0, 0 }, prev_now = { 0, 0 };
	size_t stride, i, n;

	if ((h->type == KVPROTO_RESTORE || h->type == KVPROTO_FETCH) && kvd_tier_state(&d.g, KVD_TIER_SPILL)) {
		/* Keys of blocks spilled now, picked by each key's low byte. */
		uint32_t sp[N_SLOTS], nsp = 0, s;
		size_t head = h->type == KVPROTO_FETCH ? sizeof(struct kvproto_fetch)
						       : sizeof(struct kvproto_count);

		stride = sizeof(struct kvshm_key) +
			 (h->type == KVPROTO_FETCH ? (size_t)d.h->geo.block_tokens * 4 : 0);
		if (h->len < head)
			return;
		for (s = 0; s < d.h->geo.n_slots; s++)
			if (atomic_load(&kvshm_slots(d.h)[s].state) == KVSHM_SLOT_SPILLED)
				sp[nsp++] = s;
		n = (h->len - head) / stride;
		for (i = 0; nsp && i < n; i++) {
			uint8_t *r = p + head + i * stride;
			struct kvshm_key k;

			memcpy(&k, r, sizeof(k));
			k = kvshm_slots(d.h)[sp[k.lo % nsp]].key;
			memcpy(r, &k, sizeof(k));
		}
		return;
	}
	if (h->type == KVPROTO_PIN && h->len >= sizeof(struct kvproto_pin)) {
		n = (h->len - sizeof(struct kvproto_pin)) / sizeof(struct kvshm_key);
		fix_chain(p + sizeof(struct kvproto_pin), n, sizeof(struct kvshm_key), root, NULL);
		return;
	}
	if (h->type == KVPROTO_ADMIN && h->len >= sizeof(struct kvproto_admin)) {
		fix_admin(p, h->len);
		return;
	}
	if (h->type == KVPROTO_ALLOC_KEYS && h->len >= sizeof(struct kvproto_alloc)) {
		n = (h->len - sizeof(struct kvproto_alloc)) / sizeof(struct kvproto_claim);
		for (i = 0; i < n; i++) {
			uint8_t *r = p + sizeof(struct kvproto_alloc) + i * sizeof(struct kvproto_claim);

			if (!fix_claim_key(r, root))
				fix_identity(r, sizeof(struct kvshm_key));
		}
		return;
	}
	if (!pr->n_granted || h->len < sizeof(struct kvproto_count))
		return;
	if (h->type == KVPROTO_PUBLISH)
		stride = sizeof(struct kvproto_pub) + (size_t)d.h->geo.block_tokens * 4;
	else if (h->type == KVPROTO_FREE)
		stride = sizeof(struct kvproto_pg);
	else
		return;
	n = (h->len - sizeof(struct kvproto_count)) / stride;
	for (i = 0; i < n; i++) {
		uint8_t *r = p + sizeof(struct kvproto_count) + i * stride;
		struct kvproto_pg pg;

		memcpy(&pg, r, sizeof(pg));
		pg = pr->granted[pg.page % pr->n_granted];
		memcpy(r, &pg, sizeof(pg));
		if (h->type == KVPROTO_PUBLISH) {
			/* A parent of zero is the client's root; the key the
			 * record before had is the key it has now: chains
			 * stay chains after their keys are fixed. */
			struct kvproto_pub pub;

			memcpy(&pub, r, sizeof(pub));
			if (!pub.parent.lo && !pub.parent.hi)
				pub.parent = root;
			else if (i && pub.parent.lo == prev_was.lo)
				pub.parent = prev_now;
			prev_was = pub.key;
			memcpy(r, &pub, sizeof(pub));
			fix_key(r, root);
			memcpy(&pub, r, sizeof(pub));
			prev_now = pub.key;
		}
	}
}

static void op_frame(struct in *in, uint32_t row, bool fix, bool with_pidfd)
{
	struct kvproto_hdr h;
	struct kvd_client *c;
	struct req rq = { .sent = true };
	uint8_t *buf;
	const char *why = NULL;
	uint32_t id;

	if (!take(in, &h, sizeof(h)))
		return;
	if (h.len > in->left && h.len <= KVPROTO_MAX_LEN)
		h.len = (uint32_t)in->left;	/* what the input has */
	c = frame_client(row, with_pidfd);
	if (!c) {
		in->p += h.len <= KVPROTO_MAX_LEN ? h.len : 0;
		in->left -= h.len <= KVPROTO_MAX_LEN ? h.len : 0;
		return;
	}
	id = c->id;
	rq.seq = h.seq;
	/* do_read refuses a bad header before it reads any payload. */
	if (h.magic != KVPROTO_MAGIC || h.len > KVPROTO_MAX_LEN) {
		kvd_reply_error(&d, c, h.seq, -EBADMSG, true,
				"bad frame header (magic %#x, length %u)", h.magic, h.len);
		kvd_server_drop_closing(&d);
		if (h.len <= KVPROTO_MAX_LEN) {	/* the rest of that frame is lost */
			in->p += h.len;
			in->left -= h.len;
		}
		pump((int)id, &rq);
		return;
	}
	/* Exactly one frame's bytes, as c->in holds them: ASan sees overreads. */
	buf = malloc(sizeof(h) + h.len);
	CHECK(buf);
	take(in, buf + sizeof(h), h.len);
	if (fix)
		fix_records(&peers[id], c->root, &h, buf + sizeof(h));
	memcpy(buf, &h, sizeof(h));
	if (!kvproto_decode(&h, h.len ? buf + sizeof(h) : NULL, c->bt, &why)) {
		rq.type = h.type;
		rq.bye = h.type == KVPROTO_BYE && c->hello;	/* else: HELLO first */
		if (h.type == KVPROTO_ALLOC || h.type == KVPROTO_PUBLISH || h.type == KVPROTO_FREE ||
		    h.type == KVPROTO_RESTORE || h.type == KVPROTO_FETCH ||
		    h.type == KVPROTO_ALLOC_KEYS || h.type == KVPROTO_PIN)
			memcpy(&rq.n, buf + sizeof(h), sizeof(rq.n));
	}
	kvd_server_frame(&d, c, buf);
	kvd_server_drop_closing(&d);	/* as the loop does after each event */
	free(buf);
	pump((int)id, &rq);
}

static void untrack(struct peer *pr, uint32_t slot_lo, uint32_t slot_hi)
{
	uint32_t j = 0;

	while (j < pr->n_pins) {
		if (pr->pins[j].slot >= slot_lo && pr->pins[j].slot <= slot_hi)
			pr->pins[j] = pr->pins[--pr->n_pins];
		else
			j++;
	}
}

static void op_pin(struct in *in, struct kvd_client *c, struct peer *pr)
{
	const struct kvshm_page *pages = kvshm_pages(d.h);
	uint8_t b[4];
	uint32_t slot, page, gen;

	if (!take(in, b, sizeof(b)))
		return;
	slot = (uint32_t)(b[0] | b[1] << 8) % c->nslots;
	page = b[2];
	untrack(pr, slot, slot);
	if (b[3] == 0xff) {	/* unpin */
		kvshm_ledger_unpin(c->l, slot);
		return;
	}
	gen = page < N_PAGES ? atomic_load(&pages[page].gen) : 0;
	gen += (b[3] >> 1) & 1;	/* now and then a stale generation */
	if ((b[3] & 1) || page >= N_PAGES) {
		/* A raw slot value: a hold on a WRITING page, or nonsense. */
		atomic_store(&c->l->slot[slot], kvshm_slot_pack(page, gen));
		return;
	}
	/* A pin that fails clears its slot itself; one that holds is checked
	 * after every operation (the first MAX_TRACK of them). */
	if (kvshm_ledger_pin(c->l, slot, d.h, page, gen) && pr->n_pins < MAX_TRACK)
		pr->pins[pr->n_pins++] = (typeof(pr->pins[0])){ slot, page, gen };
}

static void op_ledger(struct in *in, struct kvd_client *c, struct peer *pr)
{
	uint8_t b[3];
	size_t off, n;

	if (!take(in, b, sizeof(b)))
		return;
	off = (size_t)(b[0] | b[1] << 8) % c->ledger.bytes;
	n = b[2];
	if (n > in->left)
		n = in->left;
	if (n > c->ledger.bytes - off)
		n = c->ledger.bytes - off;
	memcpy((uint8_t *)c->l + off, in->p, n);
	in->p += n;
	in->left -= n;
	if (n && off + n > offsetof(struct kvshm_ledger, slot)) {
		size_t lo = off > offsetof(struct kvshm_ledger, slot) ?
			    off - offsetof(struct kvshm_ledger, slot) : 0;
		size_t hi = off + n - 1 - offsetof(struct kvshm_ledger, slot);

		untrack(pr, (uint32_t)(lo / 8), (uint32_t)(hi / 8));
	}
}

static void run_ops(struct in *in)
{
	uint8_t op;

	while (take(in, &op, 1)) {
		uint32_t kind = op & 15, row = (op >> 4) & (MAX_CLIENTS - 1);
		struct kvd_client *c = &d.clients[row];
		struct peer *pr = &peers[row];
		bool hello = kvd_pins_count(c);	/* a ledger to write */

		if (kind <= OP_FRAME_LAST) {
			op_frame(in, row, false, op >> 6);
			step_done();
			continue;
		}
		if (kind <= OP_FIX_LAST) {
			op_frame(in, row, true, op >> 6);
			step_done();
			continue;
		}
		switch (kind) {
		case OP_TICK:
			kvd_evict_tick(&d);
			kvd_registry_tick(&d);
			kvd_slice_tick(&d);
			kvd_nsstat_tick(&d);
			kvd_server_drop_closing(&d);
			if (d.ticks <= 3)	/* rendering is slow; the end checks too */
				check_metrics();
			break;
		case OP_HANGUP:
			if (!c->used || c->lingering)
				continue;
			forget_client(pr);
			kvd_registry_drop(&d, c, "hung up");	/* do_read's recv() == 0 */
			break;
		case OP_EXIT:
			if (!c->lingering)
				continue;
			kvd_registry_exited(&d, c);
			break;
		case OP_PIN:
			if (!hello)
				continue;
			op_pin(in, c, pr);
			break;
		case OP_LEDGER:
			if (!hello)
				continue;
			op_ledger(in, c, pr);
			break;
		case OP_TOUCH: {
			uint8_t b;

			if (!hello || !take(in, &b, sizeof(b)))
				continue;
			/* A page (64..191: out of range), or from 0xc0 on a
			 * run entry (ledger.h) from the entry before: up to 30
			 * pages up (0x20) or down, past either end now and
			 * then, or (count 31) one with stray bits and too long,
			 * which the daemon must refuse. */
			if (b < 0xc0)
				kvshm_ledger_touch(c->l, b);
			else
				kvshm_ledger_touch(c->l, KVSHM_RING_RUN |
							 (b & 0x20 ? KVSHM_RING_UP : 0) |
							 ((b & 0x1f) == 0x1f ? 0x12345u : b & 0x1fu));
			break;
		}
		case OP_HIT: {
			uint16_t k;
			uint32_t tokens;
			uint8_t n;
			char label[KVSHM_LABEL] = { 0 };

			/* Key, hit tokens, then a label of n bytes (24: no NUL). */
			if (!hello || !take(in, &k, sizeof(k)) || !take(in, &tokens, 4) ||
			    !take(in, &n, 1))
				continue;
			n %= KVSHM_LABEL + 1;
			if (!take(in, label, n))
				continue;
			kvshm_ledger_hit(c->l, (struct kvshm_key){ k, (uint64_t)k * 31 }, tokens, label);
			break;
		}
		}
		pump(-1, NULL);
		step_done();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint32_t bts[4] = { 16, 1, 5, KVSHM_MAX_BLOCK_TOKENS };
	static bool ready;
	struct in in = { data, size };
	int base_fds;
	uint8_t first;
	uint32_t i;

	if (!ready) {
		setup_once();
		ready = true;
	}
	if (!take(&in, &first, 1))
		return 0;
	/* Counted per input: libFuzzer itself opens some between inputs. */
	base_fds = count_fds();
	CHECK(base_fds > 0);
	/* The first byte picks block size, spill tier and eviction policy. */
	reset(bts[first & 3], first & 4, (first >> 3) % KVD_EVICTION_N);
	reset_seen = false;
	base_ready = base_writing = 0;
	check_state();
	run_ops(&in);

	check_metrics();
	/* Shutting down, as kvd_server_close does: everyone leaves. */
	for (i = 0; i < MAX_CLIENTS; i++) {
		if (d.clients[i].lingering)
			kvd_registry_exited(&d, &d.clients[i]);
		else if (d.clients[i].used)
			kvd_registry_bye(&d, &d.clients[i]);
	}
	pump(-1, NULL);
	/* Prefix pins end with the daemon, as in main(). */
	kvd_pin_forget(&d, UINT32_MAX, UINT32_MAX);
	/* Pages whose slices did not all come are given up at the next tick. */
	kvd_slice_tick(&d);
	/* The spill tier stops as main() stops it: writes in flight finish. */
	kvd_tiers_close(&d.g);
	check_state();
	CHECK(d.n_clients == 0);
	CHECK(kvshm_stats(d.h)->pages_writing == 0);
	for (i = 0; i < MAX_CLIENTS; i++)
		CHECK(peers[i].fd < 0);
	/* No descriptor outlives its client. */
	CHECK(count_fds() == base_fds);
	return 0;
}
