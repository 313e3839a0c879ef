// SPDX-License-Identifier: MIT
/*
 * ttft.c - kvbench's ttft mode: time to first token of a long-document
 * question with the reference engine (tinylm, tools/tinylm/, linked into
 * kvbench), warm through kvcached against a cold prefill with no cache, in
 * the same run: kvdemo's qa workload, on the same prompts
 * (tlm_make_doc / tlm_make_question) and the same default model (generated
 * weights, seed 42, 4 layers, width 256, fp32, one thread; 64 KiB pages).
 *
 * Prompt: a 2,000-token table document + a 32-token question (--quick: a
 * 512-token document). Each round takes a new document (never cached
 * before, also on a --socket daemon) and runs a miss and a cold prefill
 * (taking turns going first), then the warm runs:
 *
 *   miss   a first request through kvcached: lookup (all miss), the full
 *          prefill, its full blocks written to pool pages and published;
 *   cold   a new question, prefill with no cache at all (tlm_prefill with
 *          no handle): what an engine without kvcached pays every time;
 *   warm   new questions, the document cached: lookup, gather of the
 *          document's blocks, prefill of the question's 32 tokens.
 *
 * TTFT = tlm_prefill + the first token's argmax, CLOCK_MONOTONIC. 4 rounds
 * of 1 miss, 1 cold and 3 warm runs (--quick: 1 round, 2 warm); figures
 * are medians. Rows: warm TTFT vs cold (target: warm <= 10% of cold), and
 * the miss vs cold (what caching costs a first request).
 *
 * Verification: each warm run must hit the whole document and no cache
 * call may fail; each round the cold prompt is run again through the
 * cache and its logits must be bitwise those of the cold run.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tinylm/tinylm.h"
#include "bench.h"

#define QTOK 32

struct ttft {
	struct tlm_model m;
	struct tlm_state s;
	kvc_t *c;
	uint32_t *tok;
	size_t n;
};

/* One prefill of t->tok[0..n) into an empty state; seconds. */
static double ttft_run(struct ttft *t, kvc_t *c, unsigned flags, struct tlm_run *run)
{
	double t0 = tlm_now();
	int rc;

	tlm_state_reset(&t->s);
	rc = tlm_prefill(&t->s, c, t->tok, t->n, NULL, 0, "bench:ttft", flags, run);
	if (rc)
		die("ttft: prefill of %zu tokens: %s", t->n, strerror(-rc));
	sink += tlm_argmax(t->s.logits, t->m.cfg.vocab_size);
	t0 = tlm_now() - t0;
	if (run->cache_err)
		die("ttft: a cache call failed during the prefill: %s",
		    kvc_strerror(run->cache_err));
	return t0;
}

void mode_ttft(void)
{
	struct tlm_config cfg = TLM_DEMO_CONFIG;
	int rounds = opt.quick ? 1 : 4, nwarm = opt.quick ? 2 : 3, r, w, k, q = 0, qcold = 0;
	size_t dn = opt.quick ? 512 : 2000, vbytes, pb;
	double *cold, *miss, *warm;
	struct kvc_model km;
	struct row row = { .mode = "ttft", .procs = 1, .unit = "ms",
			   .peer_kind = "cold-prefill" };
	struct tlm_run run;
	struct ttft t = { 0 };
	const char *sock;
	float *cold_logits;
	char err[512] = "", psz[32], name[64];
	uint64_t seed = now_ns();
	int rc;

	rc = tlm_model_generate(&t.m, &cfg, TLM_DEMO_SEED, err, sizeof(err));
	if (rc)
		die("ttft: model: %s (%s)", err, strerror(-rc));
	t.n = dn + QTOK;
	vbytes = (size_t)t.m.cfg.vocab_size * sizeof(float);
	pb = (size_t)BT * t.m.cfg.n_layers * 2 * t.m.kv_dim * sizeof(float);
	t.tok = xmalloc(t.n * sizeof(uint32_t));
	cold_logits = xmalloc(vbytes);
	cold = xmalloc(rounds * sizeof(double));
	miss = xmalloc(rounds * sizeof(double));
	warm = xmalloc((size_t)rounds * nwarm * sizeof(double));
	if (tlm_state_init(&t.s, &t.m, t.n + 1))
		die("ttft: out of memory");
	snprintf(psz, sizeof(psz), "%zuK", (pb + 4095) / 4096 * 4);
	sock = opt.socket ? opt.socket : daemon_start("ttft", psz, "64M");
	km = tlm_kvc_model(&t.m, BT);
	/* kvbench's own namespace, not tinylm's (which kvdemo uses). */
	snprintf(name, sizeof(name), "kvbench-ttft-%d", (int)main_pid);
	km.name = name;
	rc = try_open(sock, &km, &t.c, err, sizeof(err));
	if (rc)
		die("ttft: kvc_open(%s, %zu-byte pages) on %s failed: %s%s%s%s", km.name, pb, sock,
		    kvc_strerror(rc), *err ? " (" : "", err, *err ? ")" : "");

	for (r = 0; r < rounds; r++) {
		/* A document no daemon has seen: its first block holds the seed. */
		if (tlm_make_doc(t.tok, dn, mix64(seed + (uint64_t)r)) != dn)
			die("ttft: out of memory");
		/* Miss and cold take turns going first. */
		for (k = 0; k < 2; k++) {
			tlm_make_question(t.tok + dn, QTOK, q++);
			if (k == r % 2) {
				miss[r] = ttft_run(&t, t.c, 0, &run) * 1e3;
				if (run.hit_tokens || run.published != t.n / BT)
					die("ttft: first request of a new document hit %zu tokens and published %zu blocks (expected 0 and %zu)",
					    run.hit_tokens, run.published, t.n / BT);
			} else {
				cold[r] = ttft_run(&t, NULL, 0, &run) * 1e3;
				memcpy(cold_logits, t.s.logits, vbytes);
				qcold = q - 1;
			}
		}

		for (w = 0; w < nwarm; w++) {
			tlm_make_question(t.tok + dn, QTOK, q++);
			warm[r * nwarm + w] = ttft_run(&t, t.c, 0, &run) * 1e3;
			if (run.hit_tokens != dn / BT * BT)
				die("ttft: a warm request hit %zu tokens, expected the document's %zu",
				    run.hit_tokens, dn / BT * BT);
		}

		/* The cold prompt again, through the cache: same bits. */
		tlm_make_question(t.tok + dn, QTOK, qcold);
		ttft_run(&t, t.c, TLM_NO_PUBLISH, &run);
		if (!run.hit_tokens || memcmp(cold_logits, t.s.logits, vbytes))
			die("ttft: logits through the cache (%zu tokens hit) differ from the cold prefill's",
			    run.hit_tokens);
	}
	bench_close(t.c);
	if (!opt.socket)
		daemon_stop(false);

	row.blocks = dn / BT;
	row.page_bytes = pb;
	row.peer = median(cold, rounds);
	row.op = "ttft_warm";
	row.kv = median(warm, (size_t)rounds * nwarm);
	add_row(&row);
	row.op = "ttft_miss";
	row.kv = median(miss, rounds);
	add_row(&row);

	tlm_state_free(&t.s);
	tlm_model_free(&t.m);
	free(t.tok);
	free(cold_logits);
	free(cold);
	free(miss);
	free(warm);
}
