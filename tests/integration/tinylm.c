// SPDX-License-Identifier: MIT
/*
 * tinylm.c - the reference engine against the real daemon: a warm prefill
 * (cached prefix gathered from pool pages, only the missed tokens run)
 * gives bitwise the logits and greedy tokens of a cold one, for cached
 * prefixes of every length from 0 blocks to the whole prompt, in this
 * process and in another one (fork + exec of this binary, which attaches
 * on its own and hits what this one published); a prompt-module
 * composition gives bitwise the logits of a cold prefill of the same
 * tokens at the same positions under the same mask.
 *
 * The model is tiny (2 layers, width 64, 16-token blocks, 8 KiB pages) so
 * the suite stays fast under ASan.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/tlm_fixture.h"
#include "../../tools/tinylm/compose.h"
#include "../../tools/tinylm/schema.h"
#include "../../tools/tinylm/tinylm.h"

#define BT 16
#define NGEN 8

static struct tlm_model model;
static const char *self_exe;

static const char *const daemon_args[] = { "--page-size", "8K", "--pool-size", "2M", NULL };

static void make_model(void)
{
	char err[256];

	if (!model.mem && kvt_tlm_model(&model, err, sizeof(err))) {
		fprintf(stderr, "model: %s\n", err);
		abort();
	}
}

static kvc_t *open_tiny(const char *sock)
{
	return kvt_tlm_open(&model, sock);
}

#define prompt kvt_tlm_prompt

/* A fresh state whose KV is all NaN, so that reading a slot nobody wrote
 * (a short gather, say) cannot go unnoticed. */
static void state_init(struct tlm_state *s, size_t cap)
{
	size_t bytes = (size_t)model.cfg.n_layers * cap * model.kv_dim * sizeof(float);

	assert_int_equal(tlm_state_init(s, &model, cap), 0);
	memset(s->kc, 0xff, bytes);
	memset(s->vc, 0xff, bytes);
}

/* Prefill (with c or without a cache), then NGEN greedy tokens. */
static struct tlm_run run_prompt(kvc_t *c, const uint32_t *t, size_t n, unsigned flags,
				 float *logits, uint32_t *gen)
{
	struct tlm_state s;
	struct tlm_run run;
	uint32_t tok;

	state_init(&s, n + NGEN);
	assert_int_equal(tlm_prefill(&s, c, t, n, NULL, 0, "test", flags, &run), 0);
	memcpy(logits, s.logits, model.cfg.vocab_size * sizeof(float));
	for (int i = 0; gen && i < NGEN; i++) {
		gen[i] = tok = tlm_argmax(s.logits, model.cfg.vocab_size);
		assert_int_equal(tlm_forward(&s, &tok, NULL, NULL, 1, 1), 0);
	}
	tlm_state_free(&s);
	return run;
}

/* For k = 0 .. all blocks: publish exactly k blocks of a prompt, then run
 * the whole prompt warm: it hits k blocks, runs only the rest, and its
 * logits and greedy tokens are those of the cold run, bit for bit. */
static void every_prefix(struct kvt_daemon *d, size_t n)
{
	size_t blocks = n / BT, k;
	float *cold = malloc(model.cfg.vocab_size * sizeof(float));
	float *warm = malloc(model.cfg.vocab_size * sizeof(float));
	uint32_t *t = malloc(n * sizeof(uint32_t)), gc[NGEN], gw[NGEN];
	kvc_t *c = open_tiny(d->sock);

	assert_non_null(c);
	for (k = 0; k <= blocks; k++) {
		struct tlm_run r;
		size_t want;

		prompt(t, n, 1000 * n + k);
		r = run_prompt(NULL, t, n, 0, cold, gc);
		assert_int_equal(r.computed, n);
		if (k) {
			r = run_prompt(c, t, k * BT, 0, warm, NULL);
			assert_int_equal(r.hit_tokens, 0);
			assert_int_equal(r.published, k);
			assert_int_equal(r.cache_err, 0);
		}
		r = run_prompt(c, t, n, TLM_NO_PUBLISH, warm, gw);
		/* All n tokens cached: the last block runs again for its logits. */
		want = k * BT < n ? k * BT : (k - 1) * BT;
		assert_int_equal(r.hit_tokens, want);
		assert_int_equal(r.computed, n - want);
		assert_int_equal(r.cache_err, 0);
		assert_memory_equal(cold, warm, model.cfg.vocab_size * sizeof(float));
		assert_memory_equal(gc, gw, sizeof(gc));
	}
	kvc_close(c);
	free(t);
	free(cold);
	free(warm);
}

static void test_warm_equals_cold_every_prefix(void **state)
{
	every_prefix(*state, 6 * BT + 5);
}

static void test_warm_equals_cold_whole_blocks(void **state)
{
	every_prefix(*state, 4 * BT);
}

/* A missing or wrong cache never changes a result: cold flag, and a
 * request that the daemon cannot serve (prompt under one block). */
static void test_cold_flag_and_short_prompt(void **state)
{
	struct kvt_daemon *d = *state;
	float a[512], b[512];
	uint32_t t[5 * BT];
	kvc_t *c = open_tiny(d->sock);
	struct tlm_run r;

	assert_non_null(c);
	prompt(t, 5 * BT, 77);
	run_prompt(NULL, t, 5 * BT, 0, a, NULL);
	r = run_prompt(c, t, 5 * BT, 0, b, NULL);		/* publishes 5 */
	assert_int_equal(r.published, 5);
	r = run_prompt(c, t, 5 * BT, TLM_NO_LOOKUP, b, NULL);	/* cold, dup publish */
	assert_int_equal(r.hit_tokens, 0);
	assert_int_equal(r.computed, 5 * BT);
	assert_memory_equal(a, b, model.cfg.vocab_size * sizeof(float));
	r = run_prompt(c, t, 7, 0, b, NULL);
	assert_int_equal(r.hit_tokens, 0);
	run_prompt(NULL, t, 7, 0, a, NULL);
	assert_memory_equal(a, b, model.cfg.vocab_size * sizeof(float));
	kvc_close(c);
}

/*
 * Child mode (this binary exec'd with --child SOCK SEED N): attach on its
 * own, run the prompt warm and write "hit_tokens computed" then the raw
 * logits to stdout.
 */
static int child_main(char **argv)
{
	size_t n = strtoul(argv[4], NULL, 10);
	uint32_t *t = malloc(n * sizeof(uint32_t));
	float *l;
	struct tlm_state s;
	struct tlm_run r;
	kvc_t *c;

	make_model();
	l = malloc(model.cfg.vocab_size * sizeof(float));
	c = open_tiny(argv[2]);
	if (!c || !t || !l || tlm_state_init(&s, &model, n))
		return 3;
	memset(s.kc, 0xff, (size_t)model.cfg.n_layers * n * model.kv_dim * sizeof(float));
	memset(s.vc, 0xff, (size_t)model.cfg.n_layers * n * model.kv_dim * sizeof(float));
	prompt(t, n, strtoul(argv[3], NULL, 10));
	if (tlm_prefill(&s, c, t, n, NULL, 0, "child", 0, &r))
		return 4;
	if (fwrite(&r, sizeof(r), 1, stdout) != 1 ||
	    fwrite(s.logits, sizeof(float), model.cfg.vocab_size, stdout) !=
		    (size_t)model.cfg.vocab_size)
		return 5;
	fflush(stdout);
	tlm_state_free(&s);
	kvc_close(c);
	free(t);
	free(l);
	tlm_model_free(&model);
	return 0;
}

/*
 * For k = 0 .. 5 cached blocks: this process publishes exactly k blocks
 * of a prompt, another process (this binary exec'd, attaching on its own)
 * runs the whole prompt: it hits the k blocks, runs only the rest and gets
 * the cold logits of this process, bit for bit.
 */
static void test_other_process_hits_and_agrees(void **state)
{
	struct kvt_daemon *d = *state;
	size_t n = 5 * BT + 9, k;
	uint32_t t[5 * BT + 9];
	float cold[512], got[512];
	char seed[16], len[16];
	struct tlm_run r;
	int fds[2];
	pid_t p;
	kvc_t *c = open_tiny(d->sock);

	assert_non_null(c);
	for (k = 0; k <= 5; k++) {
		prompt(t, n, 4242 + k);
		run_prompt(NULL, t, n, 0, cold, NULL);
		if (k) {
			r = run_prompt(c, t, k * BT, 0, got, NULL);
			assert_int_equal(r.published, k);
		}
		snprintf(seed, sizeof(seed), "%zu", 4242 + k);
		snprintf(len, sizeof(len), "%zu", n);
		assert_int_equal(pipe(fds), 0);
		p = fork();
		if (!p) {
			dup2(fds[1], 1);
			close(fds[0]);
			execl(self_exe, self_exe, "--child", d->sock, seed, len, (char *)NULL);
			_exit(127);
		}
		close(fds[1]);
		assert_int_equal(read(fds[0], &r, sizeof(r)), sizeof(r));
		assert_int_equal(read(fds[0], got, model.cfg.vocab_size * sizeof(float)),
				 model.cfg.vocab_size * sizeof(float));
		close(fds[0]);
		assert_int_equal(kvt_wait(p), 0);
		assert_int_equal(r.hit_tokens, k * BT);
		assert_int_equal(r.computed, n - k * BT);
		assert_int_equal(r.cache_err, 0);
		assert_memory_equal(cold, got, model.cfg.vocab_size * sizeof(float));
	}
	kvc_close(c);
}

/* ---- prompt modules ---- */

static const char schema_text[] =
	"<schema name=\"trip\">\n"
	"  <module name=\"system\">You are a travel agent. Answer briefly and only from the facts given below.</module>\n"
	"  <module name=\"plan\">Plan for <param name=\"who\" len=\"6\"/> going to a city in spring, with museums.</module>\n"
	"  <union>\n"
	"    <module name=\"paris\">Paris: museums open 9-18, metro tickets 2.10 euro, Louvre closed on Tuesdays.</module>\n"
	"    <module name=\"rome\">Rome: the Vatican museums need tickets booked ahead, buses 1.50 euro a ride.</module>\n"
	"  </union>\n"
	"  <module name=\"tail\">Answer in one short sentence.</module>\n"
	"  <module name=\"sig\"><param name=\"sig\" len=\"8\"/></module>\n"
	"</schema>\n";

/* Modules published so far by this test (their full blocks hit later). */
static int seen[8];

/*
 * Compose a prompt warm through the cache and cold in one forward of the
 * plan (same tokens, positions and mask): bitwise equal logits, and hits
 * exactly the full blocks of the modules an earlier prompt published.
 */
static void compose_check(kvc_t *c, const struct tlm_schema *sc, const char *const *mods,
			  size_t nmods, const struct tlm_arg *args, size_t nargs, const char *user)
{
	struct tlm_plan plan;
	struct tlm_state s;
	struct tlm_run r;
	float *cold = malloc(model.cfg.vocab_size * sizeof(float));
	size_t want = 0, k;
	char err[256];

	if (tlm_plan_build(&plan, sc, mods, nmods, args, nargs, user, strlen(user), err,
			   sizeof(err)))
		fail_msg("%s", err);
	for (k = 0; k < plan.nparts; k++)
		if (seen[plan.parts[k].mod - sc->mods])
			want += plan.parts[k].ntok / BT * BT;
	state_init(&s, plan.n);
	assert_int_equal(tlm_forward(&s, plan.tok, plan.pos, plan.lo, plan.n, 1), 0);
	memcpy(cold, s.logits, model.cfg.vocab_size * sizeof(float));
	tlm_state_free(&s);
	state_init(&s, plan.n);
	assert_int_equal(tlm_compose(&s, c, sc, &plan, &r), 0);
	assert_int_equal(r.cache_err, 0);
	assert_int_equal(r.hit_tokens, want);
	assert_int_equal(r.hit_tokens + r.computed, plan.n);
	assert_memory_equal(cold, s.logits, model.cfg.vocab_size * sizeof(float));
	for (k = 0; k < plan.nparts; k++)
		seen[plan.parts[k].mod - sc->mods] = 1;
	tlm_state_free(&s);
	tlm_plan_free(&plan);
	free(cold);
}

static void test_modules_compose_equal_cold(void **state)
{
	struct kvt_daemon *d = *state;
	struct tlm_schema sc;
	char err[256];
	kvc_t *c = open_tiny(d->sock);
	const struct tlm_arg ana = { .name = "who", .value = "Ana" };
	const struct tlm_arg bo = { .name = "who", .value = "Bo" };
	const char *a[] = { "system", "plan", "paris", "tail" };
	const char *b[] = { "system", "rome", "tail" };	/* no "plan": a gap in positions */
	const char *e[] = { "rome", "plan" };		/* any order in the prompt */
	const char *f[] = { "sig", "plan", "system" };
	const struct tlm_arg args2[] = { { "sig", "-- Ana" }, { "who", "Bo" } };
	const struct tlm_module *m;

	assert_non_null(c);
	if (tlm_schema_parse(&sc, schema_text, strlen(schema_text), "trip.xml", err, sizeof(err)))
		fail_msg("%s", err);
	/* The layout: union members share a start, the tail follows the
	 * longer of them. */
	assert_int_equal(sc.nmods, 6);
	m = tlm_schema_find(&sc, "paris");
	assert_int_equal(m->start, tlm_schema_find(&sc, "rome")->start);
	assert_int_equal(tlm_schema_find(&sc, "tail")->start,
			 m->start + (m->len > tlm_schema_find(&sc, "rome")->len ?
				     m->len : tlm_schema_find(&sc, "rome")->len));
	/* First use: nothing cached; every module's full blocks published. */
	compose_check(c, &sc, a, 4, &ana, 1, "Which museum first?");
	/* Other user text and argument: every module hits. */
	compose_check(c, &sc, a, 4, &bo, 1, "Where do I buy tickets?");
	/* Another combination at non-contiguous positions: system and tail
	 * hit what the first prompt published, rome is new. */
	compose_check(c, &sc, b, 3, NULL, 0, "How much is the bus?");
	compose_check(c, &sc, b, 3, NULL, 0, "Is the Vatican open?");
	compose_check(c, &sc, e, 2, &ana, 1, "And Ana?");
	/* A module of params only: nothing of it cached, its argument run. */
	compose_check(c, &sc, f, 3, args2, 2, "Sign it.");
	tlm_schema_free(&sc);
	kvc_close(c);
}

/*
 * kvdemo end to end, every workload, on a tiny model and its own daemon
 * (--spawn, the kvcached of this build): it exits 0 only if every warm
 * result was bitwise its cold reference and every worker succeeded.
 */
static void test_kvdemo_all_workloads(void **state)
{
	const char *demo = kvt_bin("kvdemo");
	static char out[65536];
	int fds[2], st;
	ssize_t n, got = 0;
	pid_t p;

	(void)state;
	assert_int_equal(pipe(fds), 0);
	p = fork();
	if (!p) {
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		close(fds[0]);
		execl(demo, demo, "--spawn", "--pool-size", "16M", "--layers", "2", "--dim", "64",
		      "--hidden", "128", "--heads", "4", "--kv-heads", "2", "--doc-tokens", "200",
		      "--questions", "3", "--cold-runs", "2", "--turns", "3", "--gen", "4",
		      "--group-docs", "3", "--group-doc-tokens", "48", (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	for (;;) {	/* keep draining when full, or kvdemo would block */
		char sink[4096];
		size_t room = sizeof(out) - 1 - got;

		n = room ? read(fds[0], out + got, room) : read(fds[0], sink, sizeof(sink));
		if (n <= 0)
			break;
		if (room)
			got += n;
	}
	out[got] = 0;
	close(fds[0]);
	st = kvt_wait(p);
	if (st)
		fail_msg("kvdemo exited %d:\n%s", st, out);
	assert_non_null(strstr(out, "warm logits bitwise equal to the cold run's: 2 of 2"));
	assert_non_null(strstr(out, "cached compositions bitwise equal"));
	assert_non_null(strstr(out, "kvc_group order"));
	/* multi: three processes given one new document at once compute it
	 * once (single flight): five of the six prompts reuse its 12 full
	 * blocks, whoever runs first. */
	{
		const char *m = strstr(out, "== multi:");
		unsigned long reused = 0;

		assert_non_null(m);
		m = strstr(m, "tokens reused ");
		assert_non_null(m);
		assert_int_equal(sscanf(m, "tokens reused %lu", &reused), 1);
		assert_true(reused >= 5 * 192);
	}
}

static int setup(void **state)
{
	return kvt_setup_args(state, daemon_args);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_warm_equals_cold_every_prefix),
		cmocka_unit_test(test_warm_equals_cold_whole_blocks),
		cmocka_unit_test(test_cold_flag_and_short_prompt),
		cmocka_unit_test(test_other_process_hits_and_agrees),
		cmocka_unit_test(test_modules_compose_equal_cold),
		cmocka_unit_test(test_kvdemo_all_workloads),
	};
	static char exe[4096];
	ssize_t n;
	int rc;

	if (argc == 5 && !strcmp(argv[1], "--child"))
		return child_main(argv);
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return 1;
	exe[n] = 0;
	self_exe = exe;
	make_model();
	rc = cmocka_run_group_tests_name("tinylm", tests, setup, kvt_teardown);
	tlm_model_free(&model);
	return rc;
}
