// SPDX-License-Identifier: MIT
/*
 * remote.c - kvbench's remote mode: the remote tier (kvcached --remote)
 * between two hosts, against raw libmemcached on the same servers with the
 * same pages, in the same run.
 *
 * Setup. Three memcached servers on 127.0.0.1 (TCP, free ports, -I 4m),
 * a cluster secret in kvbench's folder, and two daemons acting as two
 * hosts: A (the one kvbench starts for every mode) and B (started here),
 * each with its own socket and 1 GiB pool of 2 MiB pages, both on the
 * three servers with --remote-write publish and a 1 s timeout.
 *
 *   write   A's client publishes a run of fresh 2 MiB blocks; the clock
 *           runs from kvc_publish until A's counters say every block is
 *           written (items with header, tokens and MAC). Item
 *           bytes over that time.
 *   fetch   B's client looks the same run up (all of it offered to tier
 *           2) and kvc_restore brings it over in one round trip (B's
 *           workers multi-get it, one job per server, check every item,
 *           copy it into pages, which B publishes; the client pins them).
 *           Bytes over kvc_restore's time. Every page is compared with
 *           what A published.
 *   peer    the same pages, raw: memcached_set of each page (its own
 *           memory, as pool pages are) under a key of its own, new in
 *           every set pass as the tier's blocks are new in every round
 *           (a server stores a new item in memory it has not touched
 *           yet, which costs it more than overwriting one: on this VM
 *           0.3 GB/s against 1.4), then
 *           memcached_mget + fetch, each value copied into its page, on
 *           4 threads with a memcached_st each (the tier runs 4 workers),
 *           same servers, same ketama distribution, no header and no MAC.
 *           The mean of one pass just before and one just after the tier's.
 *   Three rounds of each; the rows are the medians of the rounds' figures,
 *   and each round's ratio is printed after the table.
 *   ttft    tinylm (kvdemo's default model, 64 KiB pages) prefills a
 *           2,000-token document and a question on A; then on B the same
 *           document with another question: warm from tier 2 (lookup, one
 *           FETCH, gather, the question's tokens) against a cold prefill
 *           on B. The warm answer's logits must be bitwise the cold's.
 *
 * Rows: mac-* (the MAC candidates, see mac_rows; no server needed),
 * remote-write and remote-fetch (GB/s, ratio to raw), ttft_remote
 * (ms, ratio to cold). --quick: 16 blocks, one round, a 512-token document.
 * Without memcached (or with --socket) the three rows say why, with no
 * figures.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libmemcached/memcached.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sodium.h>

#include "../../fmt/remote_item.h"
#include "../../libclient/observe.h"
#include "../../shm/proto.h"
#include "../../tests/lib/mcsrv.h"
#include "../tinylm/tinylm.h"
#include "bench.h"

#define PAGE (2u << 20)
#define NSRV 3
#define THREADS 4
#define QTOK 32
/* A bandwidth run, not a fault drill: on a loaded two-core machine a
 * 2 MiB set can wait past the default 100 ms for a CPU, and a server
 * marked down would skip puts. */
#define TIMEOUT "5000"

static struct {
	struct kvt_mc mc[NSRV];
	char spec[128];
	pid_t b;		/* host B's daemon */
	char bsock[128];
	const char *asock;	/* host A's */
} rm;

/* The stats of the daemon at sock, from a mapping kept per socket (so
 * that polling costs the daemon nothing). */
static struct kvshm_stats stats_of(const char *sock)
{
	static struct {
		char sock[128];
		struct kvobs o;
	} seen[2];
	struct kvshm_stats s;
	char err[256];
	int i;

	for (i = 0; i < 2 && seen[i].sock[0] && strcmp(seen[i].sock, sock); i++)
		;
	if (i == 2)
		die("remote: a third daemon to watch");
	if (!seen[i].sock[0]) {
		if (kvobs_attach(sock, &seen[i].o, err, sizeof(err)))
			die("remote: observer attach: %s", err);
		snprintf(seen[i].sock, sizeof(seen[i].sock), "%s", sock);
	}
	memcpy(&s, kvshm_stats(seen[i].o.h), sizeof(s));
	return s;
}

#define ST(s, f) atomic_load_explicit(&(s).f, memory_order_relaxed)

/* Start argv (never outliving kvbench), its output into log. */
static pid_t spawn(const char *const *argv, const char *log)
{
	pid_t p;
	int fd;

	fflush(stdout);
	fflush(stderr);
	p = fork();
	if (p < 0)
		die("fork: %s", strerror(errno));
	if (!p) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != main_pid)
			_exit(127);
		fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	return p;
}

static void servers_up(void)
{
	int i;
	size_t at = (size_t)snprintf(rm.spec, sizeof(rm.spec), "memcached:");

	for (i = 0; i < NSRV; i++) {
		rm.mc[i].mem_mb = 1024;
		if (kvt_mc_start(&rm.mc[i], "4m"))
			die("remote: memcached did not start");
		at += (size_t)snprintf(rm.spec + at, sizeof(rm.spec) - at, "%s127.0.0.1:%u",
				       i ? "," : "", rm.mc[i].port);
	}
}

static void everything_down(void)
{
	int i;

	if (rm.b > 0) {
		kill(rm.b, SIGTERM);
		waitpid(rm.b, NULL, 0);
		rm.b = 0;
	}
	for (i = 0; i < NSRV; i++)
		kvt_mc_kill(&rm.mc[i]);
}

/* The signal handler's half of everything_down: SIGKILL only. */
static void everything_kill_async(void)
{
	int i;

	if (rm.b > 0)
		kill(rm.b, SIGKILL);
	for (i = 0; i < NSRV; i++)
		if (rm.mc[i].pid > 0)
			kill(rm.mc[i].pid, SIGKILL);
}

/* One memcached server's answer to cmd ("stats", "stats items", ...), up
 * to its END line, on stderr; for a run that stopped. */
static void mc_stats_dump(uint16_t port, const char *cmd)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct timeval tv = { 2, 0 };
	char buf[65536];
	size_t got = 0;
	ssize_t k;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    dprintf(fd, "%s\r\n", cmd) < 0) {
		fprintf(stderr, "kvbench: remote: memcached :%u: %s: %s\n", port, cmd,
			strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	while (got < sizeof(buf) - 1 && (k = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0) {
		got += (size_t)k;
		buf[got] = 0;
		if (got >= 5 && !strcmp(buf + got - 5, "END\r\n"))
			break;
	}
	buf[got] = 0;
	close(fd);
	fprintf(stderr, "kvbench: remote: memcached :%u %s:\n%s", port, cmd, buf);
}

/* Why a run stopped: both hosts' remote counters and every server's
 * memory and evictions (per slab class), on stderr. */
static void remote_post_mortem(const char *asock)
{
	const char *name[2] = { "A", "B" }, *sock[2] = { asock, rm.bsock };
	int h, i;

	for (h = 0; h < 2; h++) {
		struct kvshm_stats s = stats_of(sock[h]);

		fprintf(stderr,
			"kvbench: remote: host %s: puts %llu skipped %llu errors %llu, fetches %llu hits %llu misses %llu dropped %llu stale %llu timeouts %llu, servers up %llu, pages free %llu, evictions %llu\n",
			name[h], (unsigned long long)ST(s, remote_puts),
			(unsigned long long)ST(s, remote_put_skipped),
			(unsigned long long)ST(s, remote_put_errors),
			(unsigned long long)ST(s, remote_fetches), (unsigned long long)ST(s, remote_hits),
			(unsigned long long)ST(s, remote_misses),
			(unsigned long long)ST(s, remote_dropped), (unsigned long long)ST(s, remote_stale),
			(unsigned long long)ST(s, remote_timeouts),
			(unsigned long long)ST(s, remote_servers_up),
			(unsigned long long)ST(s, pages_free), (unsigned long long)ST(s, evictions));
	}
	for (i = 0; i < NSRV; i++) {
		mc_stats_dump(rm.mc[i].port, "stats");
		mc_stats_dump(rm.mc[i].port, "stats items");
		mc_stats_dump(rm.mc[i].port, "stats slabs");
	}
}

static void wait_servers(const char *sock)
{
	int i;

	for (i = 0; i < 1000; i++) {
		struct kvshm_stats s = stats_of(sock);

		if (ST(s, remote_servers_up) == NSRV)
			return;
		sleep_ms(10);
	}
	die("remote: %s does not see its memcached servers", sock);
}

/* ------------------------------------------------------------ raw peer */

struct rawjob {
	memcached_st *mc;
	char (*keys)[48];
	size_t from, to;
	uint8_t **pages;	/* page i of the run, as a pool would hold it */
	bool get;
};

static void *raw_thread(void *arg)
{
	struct rawjob *j = arg;
	memcached_return_t rc;
	size_t i;

	if (!j->get) {
		for (i = j->from; i < j->to; i++) {
			rc = memcached_set(j->mc, j->keys[i], strlen(j->keys[i]),
					   (const char *)j->pages[i], PAGE, 0, 0);
			if (rc != MEMCACHED_SUCCESS)
				die("remote: raw memcached_set: %s", memcached_strerror(j->mc, rc));
		}
		return NULL;
	}
	for (i = j->from; i < j->to; i += 64) {
		const char *k[64];
		size_t kl[64], n = j->to - i < 64 ? j->to - i : 64, m, got = 0;
		memcached_result_st res, *r;

		for (m = 0; m < n; m++) {
			k[m] = j->keys[i + m];
			kl[m] = strlen(k[m]);
		}
		rc = memcached_mget(j->mc, k, kl, n);
		if (rc != MEMCACHED_SUCCESS)
			die("remote: raw memcached_mget: %s", memcached_strerror(j->mc, rc));
		memcached_result_create(j->mc, &res);
		while ((r = memcached_fetch_result(j->mc, &res, &rc))) {
			if (memcached_result_length(r) != PAGE)
				die("remote: raw get: a value of %zu bytes", memcached_result_length(r));
			/* Into the page of its key (its index ends the key), as
			 * the tier does. */
			{
				const char *key = memcached_result_key_value(r);
				size_t kl2 = memcached_result_key_length(r), at = kl2, idx = 0;

				while (at && key[at - 1] != '-')
					at--;
				for (; at < kl2; at++)
					idx = idx * 10 + (size_t)(key[at] - '0');
				if (idx < j->from || idx >= j->to)
					die("remote: raw get: a value for another key");
				memcpy(j->pages[idx], memcached_result_value(r), PAGE);
			}
			got++;
		}
		memcached_result_free(&res);
		if (got != n)
			die("remote: raw get: %zu of %zu values came back", got, n);
	}
	return NULL;
}

/* n pages set (or got) raw by THREADS threads; GB/s. */
static double raw_pass(memcached_st **mc, char (*keys)[48], size_t n, bool get,
		       uint8_t **pages)
{
	struct rawjob j[THREADS];
	pthread_t th[THREADS];
	static int pass;
	uint64_t t0;
	size_t k;
	int i;

	/* Sets: keys no server has held (gets read the last set's). */
	if (!get) {
		pass++;
		for (k = 0; k < n; k++)
			snprintf(keys[k], sizeof(keys[k]), "kvbench-raw-%d-%d-%zu", (int)main_pid, pass, k);
	}
	t0 = now_ns();
	for (i = 0; i < THREADS; i++) {
		j[i] = (struct rawjob){ mc[i], keys, n * (size_t)i / THREADS,
					n * (size_t)(i + 1) / THREADS, pages, get };
		if (pthread_create(&th[i], NULL, raw_thread, &j[i]))
			die("remote: pthread_create");
	}
	for (i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	return (double)n * PAGE / (double)(now_ns() - t0);
}

/* ------------------------------------------------------------ tier */

static uint64_t doc_seed(int round)
{
	return 0x7e3071ull * 1000003u + (uint64_t)round * 7919;
}

/* Until host A (at asock) has written n blocks more than in s0. */
static struct kvshm_stats wait_puts(const char *asock, const struct kvshm_stats *s0, uint64_t n)
{
	struct kvshm_stats s;
	int k;

	for (k = 0;; k++) {
		s = stats_of(asock);
		if (ST(s, remote_puts) - ST(*s0, remote_puts) >= n)
			return s;
		if (ST(s, remote_put_skipped) != ST(*s0, remote_put_skipped) ||
		    ST(s, remote_put_errors) != ST(*s0, remote_put_errors))
			die("remote: host A skipped or failed puts (see its log)");
		if (k > 100000)
			die("remote: host A's puts did not finish");
		usleep(200);
	}
}

/* Publish n fresh blocks through c (A); returns the time from kvc_publish
 * to A's last put, in ns, and the item bytes written meanwhile. */
static uint64_t tier_write(const char *asock, kvc_t *c, uint32_t *tok, size_t n, uint64_t seed,
			   const uint8_t *src, uint64_t *bytes)
{
	struct kvshm_stats s0 = stats_of(asock), s;
	struct kvc_req *r;
	uint64_t t0;
	size_t i;

	make_tokens(tok, n * BT, seed);
	ck(kvc_req_new(c, tok, n * BT, NULL, 0, &r), "kvc_req_new");
	ck(kvc_lookup(r), "kvc_lookup");
	if ((size_t)ck(kvc_alloc(r), "kvc_alloc") != n)
		die("remote: kvc_alloc granted fewer than %zu pages", n);
	for (i = 0; i < n; i++)
		memcpy(kvc_block(r, i), src, PAGE);
	t0 = now_ns();
	if ((size_t)ck(kvc_publish(r), "kvc_publish") != n)
		die("remote: kvc_publish cached fewer than %zu blocks", n);
	s = wait_puts(asock, &s0, n);
	t0 = now_ns() - t0;
	kvc_req_free(r);
	*bytes = ST(s, remote_put_bytes) - ST(s0, remote_put_bytes);
	return t0;
}

/* B fetches the same run in one kvc_restore; ns, and checks every page. */
static uint64_t tier_fetch(kvc_t *c, uint32_t *tok, size_t n, uint64_t seed, const uint8_t *src)
{
	struct kvc_req *r;
	uint64_t t0;
	size_t i;
	int hits;

	make_tokens(tok, n * BT, seed);
	ck(kvc_req_new(c, tok, n * BT, NULL, 0, &r), "kvc_req_new");
	if (ck(kvc_lookup(r), "kvc_lookup") || kvc_req_remote(r) != n)
		die("remote: host B's lookup offered %zu blocks to tier 2, not %zu",
		    kvc_req_remote(r), n);
	t0 = now_ns();
	hits = ck(kvc_restore(r), "kvc_restore");
	t0 = now_ns() - t0;
	if ((size_t)hits != n) {
		remote_post_mortem(rm.asock);
		die("remote: host B got %d of %zu blocks from tier 2", hits, n);
	}
	for (i = 0; i < n; i++)
		if (memcmp(kvc_block(r, i), src, PAGE))
			die("remote: block %zu fetched on B differs from what A published", i);
	kvc_req_free(r);
	return t0;
}

static void start_b(const char *secret, const char *extra_page)
{
	const char *argv[] = { opt.daemon ? opt.daemon : NULL, "--socket", rm.bsock, "--page-size",
			       extra_page, "--pool-size", "1G", "--hugepages", "off", "--remote",
			       rm.spec, "--remote-secret-file", secret, "--remote-timeout-ms", TIMEOUT,
			       NULL };
	char path[4096], log[300];
	int i;

	if (!argv[0]) {
		ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 16);

		if (n <= 0)
			die("remote: /proc/self/exe: %s", strerror(errno));
		path[n] = 0;
		strcpy(strrchr(path, '/') + 1, "kvcached");
		argv[0] = path;
	}
	snprintf(rm.bsock, sizeof(rm.bsock), "%s/remote-b.sock", run_dir());
	snprintf(log, sizeof(log), "%s/remote-b.log", run_dir());
	rm.b = spawn(argv, log);
	for (i = 0; i < 1000 && !kvproto_can_connect(rm.bsock); i++)
		sleep_ms(10);
	if (i == 1000)
		die("remote: host B's kvcached did not start (see %s)", log);
}

/* ------------------------------------------------------------ ttft */

static double prefill_ms(struct tlm_state *s, const struct tlm_model *m, kvc_t *c,
			 const uint32_t *tok, size_t n, struct tlm_run *run)
{
	double t0 = tlm_now();
	int rc;

	tlm_state_reset(s);
	rc = tlm_prefill(s, c, tok, n, NULL, 0, "bench:remote", 0, run);
	if (rc)
		die("remote: prefill: %s", strerror(-rc));
	sink += tlm_argmax(s->logits, m->cfg.vocab_size);
	t0 = tlm_now() - t0;
	if (run->cache_err)
		die("remote: a cache call failed in a prefill: %s", kvc_strerror(run->cache_err));
	return t0 * 1e3;
}

static void ttft_rows(const char *asock)
{
	struct tlm_config cfg = TLM_DEMO_CONFIG;
	int rounds = opt.quick ? 1 : 4, r;
	size_t dn = opt.quick ? 512 : 2000, n = dn + QTOK, vbytes;
	struct tlm_model m;
	struct tlm_state s;
	struct tlm_run run;
	struct kvc_model km;
	double *cold = xmalloc(rounds * sizeof(double)), *warm = xmalloc(rounds * sizeof(double));
	uint32_t *tok = xmalloc(n * sizeof(uint32_t));
	float *cold_logits;
	char err[256];
	kvc_t *ca, *cb;
	uint64_t seed = now_ns();

	if (tlm_model_generate(&m, &cfg, TLM_DEMO_SEED, err, sizeof(err)))
		die("remote: model: %s", err);
	vbytes = (size_t)m.cfg.vocab_size * sizeof(float);
	cold_logits = xmalloc(vbytes);
	if (tlm_state_init(&s, &m, n + 1))
		die("remote: out of memory");
	km = tlm_kvc_model(&m, BT);
	ca = open_model(asock, &km);
	cb = open_model(rm.bsock, &km);
	for (r = 0; r < rounds; r++) {
		struct kvshm_stats s0 = stats_of(asock);

		if (tlm_make_doc(tok, dn, mix64(seed + (uint64_t)r)) != dn)
			die("remote: out of memory");
		tlm_make_question(tok + dn, QTOK, 2 * r);
		prefill_ms(&s, &m, ca, tok, n, &run);	/* host A: the document is new */
		wait_puts(asock, &s0, run.published);
		/* Host B, another question: cold, then warm from tier 2. */
		tlm_make_question(tok + dn, QTOK, 2 * r + 1);
		cold[r] = prefill_ms(&s, &m, NULL, tok, n, &run);
		memcpy(cold_logits, s.logits, vbytes);
		warm[r] = prefill_ms(&s, &m, cb, tok, n, &run);
		if (run.hit_tokens != dn / BT * BT) {
			remote_post_mortem(asock);
			die("remote: host B hit %zu tokens of the document, expected %zu (round %d)",
			    run.hit_tokens, dn / BT * BT, r);
		}
		if (memcmp(cold_logits, s.logits, vbytes))
			die("remote: host B's logits through tier 2 differ from its cold prefill's");
	}
	add_row(&(struct row){ "remote", "ttft_remote", 1, dn / BT,
			       (size_t)BT * m.cfg.n_layers * 2 * m.kv_dim * sizeof(float), NULL,
			       "ms", "cold-prefill", median(warm, (size_t)rounds),
			       median(cold, (size_t)rounds), NULL });
	kvc_close(ca);
	kvc_close(cb);
	tlm_state_free(&s);
	tlm_model_free(&m);
	free(cold);
	free(warm);
	free(tok);
	free(cold_logits);
}

/* ------------------------------------------------------------ MACs */

/*
 * The MAC candidates for a remote item, on one core, over a whole 2 MiB
 * item (header, tokens, page): HMAC-SHA256 (item format 1, OpenSSL's
 * EVP_MAC, the peer), keyed BLAKE2b-256 (libsodium crypto_generichash),
 * and what format 2 runs: kvd_rval_seal (a fresh nonce, XChaCha20 for the
 * one-time key, Poly1305 over the item) and kvd_rval_check of a good
 * item (the same tag recomputed and compared, then the identity checks).
 * Alternating slices, ROUNDS each, medians; GB/s of item bytes.
 */
enum { MAC_HMAC, MAC_BLAKE2B, MAC_SEAL, MAC_CHECK, MAC_N };

struct mac_bench {
	uint8_t *item;
	size_t len;
	EVP_MAC_CTX *hmac;
	struct kvd_rmac *rm;
	struct kvshm_ns ns;
	uint32_t tokens[BT];
	struct kvd_rval_want want;
};

static void mac_once(struct mac_bench *b, int kind)
{
	uint8_t out[32];
	size_t olen;
	enum kvd_rval_fail fail;
	const char *why;
	static const uint8_t key[32] = "kvbench MAC candidate key, 32 B";

	switch (kind) {
	case MAC_HMAC:
		if (!EVP_MAC_init(b->hmac, NULL, 0, NULL) ||
		    !EVP_MAC_update(b->hmac, b->item, b->len - KVD_RVAL_MAC) ||
		    !EVP_MAC_final(b->hmac, out, &olen, sizeof(out)))
			die("remote: HMAC-SHA256 failed");
		break;
	case MAC_BLAKE2B:
		crypto_generichash(out, 32, b->item, b->len - KVD_RVAL_MAC, key, sizeof(key));
		break;
	case MAC_SEAL:
		if (kvd_rval_seal(b->rm, b->item, b->len))
			die("remote: kvd_rval_seal failed");
		break;
	default:
		if (kvd_rval_check(b->rm, b->item, b->len, &b->want, &fail, &why))
			die("remote: a sealed item does not check: %s", why);
		break;
	}
	sink += out[0];
}

static double mac_slice(struct mac_bench *b, int kind, uint64_t ns)
{
	uint64_t t0 = now_ns(), n = 0;

	do {
		mac_once(b, kind);
		n++;
	} while (now_ns() - t0 < ns);
	return (double)(n * b->len) / (double)(now_ns() - t0);
}

static void mac_rows(void)
{
	static const char *const ops[MAC_N] = { NULL, "mac-blake2b", "mac-poly1305-seal",
						"mac-poly1305-check" };
	char digest[] = "SHA256";
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
		OSSL_PARAM_construct_end(),
	};
	struct kvproto_hello hi = { .dtype_bytes = 2, .layers = 32, .kv_heads = 8,
				    .head_dim = 128, .block_tokens = BT,
				    .pos_kind = KVSHM_POS_ROPE };
	uint64_t slice = (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS * (MAC_N - 1)));
	double v[MAC_N][ROUNDS];
	struct mac_bench b;
	EVP_MAC *mac;
	size_t i;
	int k, r;

	memset(&b, 0, sizeof(b));
	strcpy(hi.model, "kvbench-mac");
	if (kvproto_hello_ns(&hi, &b.ns) || b.ns.page_bytes != PAGE)
		die("remote: the MAC bench's namespace is not one of 2 MiB pages");
	for (i = 0; i < BT; i++)
		b.tokens[i] = (uint32_t)(i * 7);
	b.want = (struct kvd_rval_want){ &b.ns, { 1, 2 }, { 3, 4 }, b.tokens, BT };
	b.len = kvd_rval_bytes(BT, PAGE);
	b.item = xmalloc(b.len);
	kvd_rval_fill(b.item, &b.ns, b.want.key, b.want.parent, b.tokens, BT, PAGE);
	for (i = kvd_rval_payload_off(BT); i + 8 <= b.len; i += 8)
		memcpy(b.item + i, &(uint64_t){ mix64(i) }, 8);
	mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	b.hmac = mac ? EVP_MAC_CTX_new(mac) : NULL;
	EVP_MAC_free(mac);
	if (!b.hmac || !EVP_MAC_init(b.hmac, (const uint8_t *)"kvbench secret", 14, params) ||
	    kvd_rmac_new(&b.rm, "kvbench cluster secret, 32 bytes", 32))
		die("remote: MAC setup failed");
	for (k = 0; k < MAC_N; k++)	/* warm */
		mac_slice(&b, k, slice / 4);
	for (r = 0; r < ROUNDS; r++)
		for (k = 0; k < MAC_N; k++)
			v[k][r] = mac_slice(&b, k, slice);
	for (k = 1; k < MAC_N; k++)
		add_row(&(struct row){ "remote", ops[k], 1, 1, PAGE, NULL, "GB/s", "hmac-sha256",
				       median(v[k], ROUNDS), median(v[MAC_HMAC], ROUNDS), NULL });
	EVP_MAC_CTX_free(b.hmac);
	kvd_rmac_free(b.rm);
	free(b.item);
}

/* ------------------------------------------------------------ mode */

static void row(const char *op, size_t n, const char *peer, double kv, double pr,
		const char *skipped)
{
	add_row(&(struct row){ "remote", op, 1, n, PAGE, NULL, "GB/s", peer, kv, pr, skipped });
}

void mode_remote(void)
{
	size_t n = opt.quick ? 16 : 128, i;
	int rounds = opt.quick ? 1 : 3, k;
	char secret[300], name[64];
	/* Each round's figures; the rows are their medians. */
	double kv_w[3], kv_f[3], raw_w[3], raw_f[3], rw[3], rf[3];
	size_t at;
	const char *asock;
	memcached_st *mc[THREADS];
	char (*keys)[48];
	uint8_t *src, **pages;
	uint32_t *tok;
	struct kvc_model m;
	kvc_t *ca, *cb;
	int fd;

	mac_rows();
	if (opt.socket || !kvt_mc_bin()) {
		const char *why = opt.socket ? "needs two daemons and memcached servers kvbench starts"
					     : "memcached not found";

		row("remote-write", 0, "memcached-set", 0, 0, why);
		row("remote-fetch", 0, "memcached-get", 0, 0, why);
		add_row(&(struct row){ "remote", "ttft_remote", 1, 0, 0, NULL, "ms", "cold-prefill",
				       0, 0, why });
		return;
	}
	/* die() and signals stop them too: memcached drops to user nobody,
	 * which clears the death signal its fork set. */
	bench_at_exit(everything_down, everything_kill_async);
	servers_up();
	snprintf(secret, sizeof(secret), "%s/remote-secret", run_dir());
	fd = open(secret, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, "kvbench cluster secret, 32 bytes", 32) != 32)
		die("remote: %s: %s", secret, strerror(errno));
	close(fd);
	{
		const char *args[] = { "--remote", rm.spec, "--remote-secret-file", secret,
				       "--remote-timeout-ms", TIMEOUT, NULL };

		asock = daemon_start_args("remote-a", "2M", "1G", args);
		rm.asock = asock;
	}
	start_b(secret, "2M");
	wait_servers(asock);
	wait_servers(rm.bsock);

	snprintf(name, sizeof(name), "kvbench-remote-%d", (int)main_pid);
	m = big_model(name, 32);	/* 2 MiB pages */
	ca = open_model(asock, &m);
	cb = open_model(rm.bsock, &m);
	src = xmalloc(PAGE);
	for (i = 0; i < PAGE / 8; i++)
		((uint64_t *)src)[i] = mix64(i);
	tok = xmalloc(n * BT * sizeof(uint32_t));
	/* The raw peer's pages: as many as the run, each its own memory (a
	 * single hot buffer would flatter it). */
	pages = xmalloc(n * sizeof(*pages));
	for (i = 0; i < n; i++) {
		pages[i] = xmalloc(PAGE);
		memcpy(pages[i], src, PAGE);
	}
	keys = xmalloc(n * sizeof(*keys));	/* named by each set pass */
	for (k = 0; k < THREADS; k++) {
		mc[k] = memcached_create(NULL);
		if (!mc[k])
			die("remote: memcached_create");
		for (i = 0; i < NSRV; i++)
			memcached_server_add(mc[k], "127.0.0.1", rm.mc[i].port);
		memcached_behavior_set(mc[k], MEMCACHED_BEHAVIOR_DISTRIBUTION,
				       MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA);
		memcached_behavior_set(mc[k], MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
	}
	/* Warm the pools' first touch and the connections. */
	tier_write(asock, ca, tok, 8, doc_seed(999), src, &(uint64_t){ 0 });
	tier_fetch(cb, tok, 8, doc_seed(999), src);
	raw_pass(mc, keys, 8, false, pages);

	for (k = 0; k < rounds; k++) {
		uint64_t bytes, t;
		double w_a, w_b, f_a, f_b;

		w_a = raw_pass(mc, keys, n, false, pages);
		t = tier_write(asock, ca, tok, n, doc_seed(k), src, &bytes);
		w_b = raw_pass(mc, keys, n, false, pages);
		kv_w[k] = (double)bytes / (double)t;
		raw_w[k] = (w_a + w_b) / 2;
		rw[k] = kv_w[k] / raw_w[k];
		f_a = raw_pass(mc, keys, n, true, pages);
		t = tier_fetch(cb, tok, n, doc_seed(k), src);
		f_b = raw_pass(mc, keys, n, true, pages);
		kv_f[k] = (double)bytes / (double)t;
		raw_f[k] = (f_a + f_b) / 2;
		rf[k] = kv_f[k] / raw_f[k];
	}
	kvc_close(ca);
	kvc_close(cb);
	row("remote-write", n, "memcached-set", median(kv_w, (size_t)rounds),
	    median(raw_w, (size_t)rounds), NULL);
	row("remote-fetch", n, "memcached-get", median(kv_f, (size_t)rounds),
	    median(raw_f, (size_t)rounds), NULL);
	/* The spread: each round's ratio. */
	at = strlen(mode_text);
	at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at,
			       "remote: by round, write / raw set");
	for (k = 0; k < rounds; k++)
		at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at, " %.3f", rw[k]);
	at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at, ", fetch / raw get");
	for (k = 0; k < rounds; k++)
		at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at, " %.3f", rf[k]);
	snprintf(mode_text + at, sizeof(mode_text) - at, "\n");
	ttft_rows(asock);

	for (k = 0; k < THREADS; k++) {
		memcached_free(mc[k]);
	}
	free(keys);
	free(tok);
	for (i = 0; i < n; i++)
		free(pages[i]);
	free(pages);
	free(src);
	daemon_stop(false);
	everything_down();
}
