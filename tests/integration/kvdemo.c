// SPDX-License-Identifier: MIT
/*
 * kvdemo.c - kvdemo as a user runs it, against the real daemon:
 *   - prompt files (a long shared prefix, different tails) through plain
 *     automatic prefix caching, in one process and spread over two: each
 *     prompt reports its tokens and hit tokens (the second hits the shared
 *     prefix's full blocks, also across processes), and with
 *     --compare-cold its cached run's logits and answer are bitwise those
 *     of a run with no cache;
 *   - --workload runs workloads in the order given; TINYLM.md's
 *     prompt-module example (tools/examples/trip.xml) runs as printed;
 *   - against a daemon it did not start: it takes the daemon's block
 *     size, warns when its pages are much smaller than the daemon's (with
 *     the page size that would fit), and says how to start a daemon that
 *     fits when the daemon's pages are too small;
 *   - mistakes get one line naming them: an unknown option, a missing
 *     prompt file, no daemon at the socket (the path is in the message);
 *   - a daemon killed while kvdemo waits for blocks another process is
 *     writing: kvdemo computes them, says the connection was lost, does
 *     not send the user to kvstat, and exits non-zero.
 *   - it says at the prompt when the share cap stopped it publishing, and
 *     labels every --prompt distinctly;
 *   - its hit ratio is the figure kvstat shows for the same run (both
 *     truncate to one decimal), and kvstat's top prefix carries the name
 *     kvdemo printed for the prompt that hit it last.
 *
 * The model is tiny (1 layer, width 32: 2 KiB pages of 16 tokens) so that
 * a run takes well under a second.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../../shm/stats.h"
#include "../../tools/tinylm/tinylm.h"

#define TINY "--layers", "1", "--dim", "32", "--hidden", "64", "--heads", "2", "--kv-heads", "1"

static char dir[] = "/tmp/kvt-kvdemo.XXXXXX", f1[64], f2[64], f3[64];
/* Bytes the three prompt files share, and each one's length. */
#define SHARED 700

static void write_file(const char *path, const char *a, const char *b)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(a, f);
	fputs(b, f);
	assert_int_equal(fclose(f), 0);
}

static int setup(void **state)
{
	static char doc[SHARED + 1];

	(void)state;
	if (!mkdtemp(dir))
		return -1;
	for (int i = 0; i < SHARED; i++)
		doc[i] = "abcdefghij klmnopqrstuvwxyz\n"[(i * 7 + i / 13) % 28];
	snprintf(f1, sizeof(f1), "%s/q1.txt", dir);
	snprintf(f2, sizeof(f2), "%s/q2.txt", dir);
	snprintf(f3, sizeof(f3), "%s/q3.txt", dir);
	write_file(f1, doc, "1: where are the bolts?");
	write_file(f2, doc, "2: how many nuts are left in bin 4?");
	write_file(f3, doc, "Q3?");
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(f1);
	unlink(f2);
	unlink(f3);
	rmdir(dir);
	return 0;
}

/* The line of prompt n, without its newline, in line[]. */
static void whole_line(const char *out, int n, char *line, size_t len)
{
	char want[32];
	const char *p, *e;

	snprintf(want, sizeof(want), "  prompt %d (", n);
	p = strstr(out, want);
	if (!p)
		fail_msg("no line for prompt %d in:\n%s", n, out);
	e = strchr(p, '\n');
	assert_non_null(e);
	snprintf(line, len, "%.*s", (int)(e - p), p);
}

/* "prompt N (...): T tokens, H hit tokens" of prompt n in out; the line
 * from "): " on in rest. */
static void prompt_line(const char *out, int n, unsigned *tokens, unsigned *hit, char *rest,
			size_t len)
{
	char line[1024];
	const char *p;

	whole_line(out, n, line, sizeof(line));
	p = strstr(line, "): ");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "): %u tokens, %u hit tokens", tokens, hit), 2);
	snprintf(rest, len, "%s", p);
}

/* The shared prefix is BOS + SHARED bytes: the second and third prompts
 * hit its full blocks (the tails differ from byte SHARED on). */
static void check_prompts(const char *out, int procs)
{
	unsigned tok, hit, want = (1 + SHARED) / 16 * 16;
	char rest[512];

	prompt_line(out, 1, &tok, &hit, rest, sizeof(rest));
	assert_int_equal(tok, 1 + SHARED + strlen("1: where are the bolts?"));
	assert_int_equal(hit, 0);
	assert_non_null(strstr(rest, "logits bitwise equal"));
	prompt_line(out, 2, &tok, &hit, rest, sizeof(rest));
	assert_int_equal(hit, want);
	assert_non_null(strstr(rest, "logits bitwise equal"));
	assert_non_null(strstr(rest, "cached "));
	prompt_line(out, 3, &tok, &hit, rest, sizeof(rest));
	assert_int_equal(tok, 1 + SHARED + 3);
	assert_int_equal(hit, want);
	assert_non_null(strstr(rest, "logits bitwise equal"));
	if (procs > 1) {
		/* Prompt i ran in process i mod 2: prompt 2 hit across them. */
		assert_non_null(strstr(out, "(q1.txt, process 0)"));
		assert_non_null(strstr(out, "(q2.txt, process 1)"));
		assert_non_null(strstr(out, "(q3.txt, process 0)"));
	}
	assert_non_null(strstr(out, "cached runs bitwise equal to their cold runs"));
	assert_non_null(strstr(out, "answers are not meaningful text"));
	assert_null(strstr(out, "FAILED"));
}

static void run_prompts(int procs)
{
	char p[8], out[32768];
	const char *args[] = { "--spawn", "--pool-size", "16M", TINY, "--compare-cold",
			       "--max-tokens", "4", "--procs", p, "--prompt-file", f1,
			       "--prompt-file", f2, "--prompt-file", f3, NULL };
	int rc;

	snprintf(p, sizeof(p), "%d", procs);
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo: status %d\n%s", rc, out);
	check_prompts(out, procs);
}

static void test_prompt_files_one_process(void **state)
{
	(void)state;
	run_prompts(1);
}

static void test_prompt_files_two_processes(void **state)
{
	(void)state;
	run_prompts(2);
}

/* Workloads run in the order given; --prompt TEXT is a prompt too. */
static void test_workload_order(void **state)
{
	const char *args[] = { "--spawn", "--pool-size", "16M", TINY, "--workload",
			       "chat,prompts", "--turns", "1", "--gen", "2", "--prompt",
			       "hello there", NULL };
	char out[32768], *chat, *prompts;
	unsigned tok, hit;
	char rest[256];

	(void)state;
	assert_int_equal(kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out)), 0);
	chat = strstr(out, "== chat");
	prompts = strstr(out, "== prompts");
	assert_non_null(chat);
	assert_non_null(prompts);
	assert_true(chat < prompts);
	prompt_line(out, 1, &tok, &hit, rest, sizeof(rest));
	assert_int_equal(tok, 1 + strlen("hello there"));
	assert_non_null(strstr(out, "(\"hello there\")"));
}

/* An external daemon: its block size is taken; pages much larger than
 * the model's give a note with the page size that fits; pages too small
 * stop kvdemo with how to start one that fits. */
static void test_external_daemon_geometry(void **state)
{
	const char *big[] = { "--page-size", "128K", "--pool-size", "4M", "--block-tokens", "8",
			      NULL };
	const char *small[] = { "--page-size", "4K", "--pool-size", "1M", "--block-tokens", "32",
				NULL };
	const char *args[] = { "--socket", NULL, TINY, "--max-tokens", "1", "--prompt", "abc", NULL };
	struct kvt_daemon d;
	char out[16384];
	int rc;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, big), 0);
	args[1] = d.sock;
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo: status %d\n%s", rc, out);
	/* 8-token blocks of 1 layer x 2 x 16 x 4 bytes: 1 KiB pages. */
	assert_non_null(strstr(out, "1024-byte pages of 8 tokens"));
	assert_non_null(strstr(out, "kvdemo: note: model tinylm-"));
	assert_non_null(strstr(out, "fills 1 KiB of each 128 KiB pool page (0.8%)"));
	assert_non_null(strstr(out, "--page-size 4K fits it"));
	assert_int_equal(kvt_daemon_stop(&d), 0);

	/* 4 KiB pages, 32-token blocks: the model needs 4 KiB, it fits; with
	 * 2 layers it needs 8 KiB. */
	assert_int_equal(kvt_daemon_start(&d, small), 0);
	args[1] = d.sock;
	args[3] = "2";
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	assert_int_equal(rc, 2);
	assert_non_null(strstr(out, "has 4096-byte pages; this model needs 8192-byte pages (32 tokens per block): start one that fits, e.g. build/kvcached --socket /tmp/kvdemo.sock --page-size 8K --block-tokens 32"));
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* TINYLM.md's prompt-module example, as printed there (its schema is
 * tools/examples/trip.xml): composed through the cache, bitwise equal to
 * an uncached prefill. */
static void test_schema_example(void **state)
{
	const char *args[] = { "--spawn", "--pool-size", "16M", TINY, "--workload", "modules",
			       "--schema", "tools/examples/trip.xml", "--modules", "rome,plan",
			       "--arg", "who=Ana", "--user", "When do museums open?", NULL };
	char out[32768];
	int rc;

	(void)state;
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo: status %d\n%s", rc, out);
	assert_non_null(strstr(out, "== modules: schema trip"));
	assert_non_null(strstr(out, "prompt 1 [rome plan]"));
	assert_non_null(strstr(out, "cached compositions bitwise equal to uncached prefills"));
}

/* The prompt of the daemon-death test, and kvdemo's model for it (TINY,
 * kvdemo's seed and default positions). */
#define LOST_PROMPT "a prompt whose blocks another process claims and never writes: kvdemo waits"

/* Claim every full block of LOST_PROMPT as kvdemo will key it, say so on
 * `ready`, and hold the pages unpublished until killed. */
static void claim_prompt(const char *sock, int ready)
{
	struct tlm_config cfg = { .dim = 32, .hidden_dim = 64, .n_layers = 1, .n_heads = 2,
				  .n_kv_heads = 1, .seq_len = 8192 };
	struct kvc_options o = { .size = sizeof(o), .socket_path = sock };
	struct tlm_model m;
	struct kvc_model km;
	struct kvc_req *r;
	uint32_t t[128];
	char err[256];
	size_t n;
	kvc_t *c;

	if (tlm_model_generate(&m, &cfg, TLM_DEMO_SEED, err, sizeof(err)))
		_exit(3);
	km = tlm_kvc_model(&m, 16);
	n = tlm_tokenize(LOST_PROMPT, strlen(LOST_PROMPT), 1, t, 128);
	if (kvc_open(&km, &o, &c) || kvc_req_new(c, t, n, NULL, 0, &r) || kvc_lookup(r) ||
	    kvc_alloc(r) != (int)(n / 16) || write(ready, "c", 1) != 1)
		_exit(4);
	for (;;)
		pause();
}

static void test_daemon_killed_mid_wait(void **state)
{
	const char *args[] = { "--socket", NULL, TINY, "--max-tokens", "1", "--prompt",
			       LOST_PROMPT, NULL };
	struct kvshm_stats st;
	struct kvt_daemon d;
	char out[16384], b;
	int ready[2], res[2], rc = -1, tries;
	pid_t w, k;
	ssize_t got;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	assert_int_equal(pipe(ready), 0);
	w = fork();
	assert_true(w >= 0);
	if (!w)
		claim_prompt(d.sock, ready[1]);
	assert_int_equal(read(ready[0], &b, 1), 1);
	/* kvdemo in a child: its status and output come back on a pipe. */
	assert_int_equal(pipe(res), 0);
	args[1] = d.sock;
	k = fork();
	assert_true(k >= 0);
	if (!k) {
		close(res[0]);
		rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
		if (write(res[1], &rc, sizeof(rc)) != sizeof(rc) ||
		    write(res[1], out, strlen(out) + 1) < 0)
			_exit(1);
		_exit(0);
	}
	close(res[1]);
	/* kvdemo has looked the prompt up (and so waits for the claimed
	 * blocks) once the daemon counts a second lookup: kill it then. */
	for (tries = 0; tries < 4000; tries++) {
		kvt_stats(d.sock, &st);
		if (st.lookups >= 2)
			break;
		usleep(5000);
	}
	assert_int_equal(kill(d.pid, SIGKILL), 0);
	got = read(res[0], &rc, sizeof(rc));
	memset(out, 0, sizeof(out));
	if (got == sizeof(rc))
		got = read(res[0], out, sizeof(out) - 1);
	close(res[0]);
	kill(w, SIGKILL);
	assert_int_equal(kvt_wait(w), 128 + SIGKILL);
	assert_int_equal(kvt_wait(k), 0);
	assert_int_equal(kvt_daemon_stop(&d), -1);
	close(ready[0]);
	close(ready[1]);
	/* Without the check kvdemo waits a minute and runs into kvt_run's
	 * alarm; with it: computed, the loss said, status 1, no kvstat. */
	if (rc != 1)
		fail_msg("kvdemo: status %d (want 1)\n%s", rc, out);
	assert_non_null(strstr(out, "connection to kvcached was lost"));
	assert_non_null(strstr(out, "prompt 1 ("));
	assert_null(strstr(out, "kvstat"));
}

/*
 * Issue #24: when the share cap stops a prompt's publish, kvdemo says so
 * right under that prompt's line, with the counts, not at a later
 * prompt's error. 16 pages of 4 KiB, a max-share of 50%: 8 pages; a
 * prompt of 307 tokens has 19 full blocks.
 */
static void test_share_cap_said_at_that_prompt(void **state)
{
	static const char said[] = "\n    published 8 of 19 blocks: share cap (max-share) reached\n";
	char text[400], out[32768], line[512];
	const char *args[] = { "--spawn", "--pool-size", "64K", TINY, "--max-tokens", "1",
			       "--prompt", text, NULL };
	const char *p;
	int rc;

	(void)state;
	for (int i = 0; i < 306; i++)
		text[i] = "abcdefghij klmnop "[i % 18];
	text[306] = 0;
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo: status %d\n%s", rc, out);
	whole_line(out, 1, line, sizeof(line));
	assert_non_null(strstr(line, ": 307 tokens, 0 hit tokens"));
	p = strstr(out, line) + strlen(line);
	if (strncmp(p, said, strlen(said)))
		fail_msg("no share-cap line right under prompt 1:\n%s", out);
}

/*
 * Issue #24: every --prompt reads differently, also when they share an
 * opening longer than the 24 bytes a label shows; a repeated text says
 * which prompt it repeats.
 */
static void test_prompt_labels_distinct(void **state)
{
	static const char sys[] = "You are a careful assistant for the depot. ";
	char a[128], b[128], out[32768], l1[512], l2[512], l3[512], l4[512];
	const char *args[] = { "--spawn", "--pool-size", "16M", TINY, "--max-tokens", "1",
			       "--prompt", a, "--prompt", b, "--prompt", "short one",
			       "--prompt", a, NULL };
	int rc;

	(void)state;
	snprintf(a, sizeof(a), "%sWhere are the bolts?", sys);
	snprintf(b, sizeof(b), "%sHow many nuts are in bin 4?", sys);
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo: status %d\n%s", rc, out);
	whole_line(out, 1, l1, sizeof(l1));
	whole_line(out, 2, l2, sizeof(l2));
	whole_line(out, 3, l3, sizeof(l3));
	whole_line(out, 4, l4, sizeof(l4));
	*strstr(l1, "): ") = 0;
	*strstr(l2, "): ") = 0;
	*strstr(l4, "): ") = 0;
	assert_non_null(strstr(l1, "depot. Where are the bo"));
	assert_non_null(strstr(l2, "depot. How many nuts ar"));
	assert_non_null(strstr(l1, "\"You are a ca..."));	/* where both start */
	assert_string_not_equal(l1 + 11, l2 + 11);		/* past "prompt N" */
	assert_non_null(strstr(l3, "(\"short one\"): "));
	assert_string_equal(l4, "  prompt 4 (the text of prompt 1");
}

/* The line of out that starts with (after blanks) `head`, into line. */
static void line_with(const char *out, const char *head, char *line, size_t len)
{
	const char *p = out;

	for (;;) {
		p = strstr(p, head);
		assert_non_null(p);
		if (p == out || p[-1] == '\n' || p[-1] == ' ')
			break;
		p++;
	}
	snprintf(line, len, "%.*s", (int)strcspn(p, "\n"), p);
}

static void test_hit_ratio_and_label_match_kvstat(void **state)
{
	const char *args[] = { "--socket", NULL, TINY, "--max-tokens", "1", "--prompt-file", f1,
			       "--prompt-file", f2, "--prompt-file", f3, NULL };
	const char *stat[] = { "--socket", NULL, NULL };
	char out[32768], st[32768], line[512], demo[32], kv[32];
	struct kvt_daemon d;
	const char *p;
	int rc;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	args[1] = stat[1] = d.sock;
	rc = kvt_run(kvt_bin("kvdemo"), args, out, sizeof(out));
	if (rc)
		fail_msg("kvdemo: status %d\n%s", rc, out);
	/* kvstat's counters come from the daemon's tick: give it one. */
	usleep(50000);
	rc = kvt_run(kvt_bin("kvstat"), stat, st, sizeof(st));
	assert_int_equal(kvt_daemon_stop(&d), 0);
	if (rc)
		fail_msg("kvstat: status %d\n%s", rc, st);
	p = strstr(out, "(hit ratio ");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "(hit ratio %31[0-9.%])", demo), 1);
	line_with(strstr(st, "HIT RATIO"), "tokens ", line, sizeof(line));
	assert_int_equal(sscanf(line, "tokens %31s", kv), 1);
	if (strcmp(demo, kv))
		fail_msg("kvdemo says hit ratio %s, kvstat tokens %s:\n%s\n%s", demo, kv, out, st);
	if (!strstr(strstr(st, "TOP PREFIXES"), " prompt 3 q3.txt "))
		fail_msg("the top prefix is not labelled as kvdemo named its last hitter:\n%s", st);
}

static void test_mistakes_named(void **state)
{
	const char *bad_opt[] = { "--spawn", "--no-such-option", NULL };
	const char *missing[] = { "--spawn", "--prompt-file", "/nonexistent/q.txt", NULL };
	const char *empty[] = { "--workload", "prompts", NULL };
	const char *nodaemon[] = { "--socket", "/nonexistent/kv.sock", "--prompt", "x", NULL };
	char out[8192];

	(void)state;
	assert_int_equal(kvt_run(kvt_bin("kvdemo"), bad_opt, out, sizeof(out)), 2);
	assert_string_equal(out, "kvdemo: unknown option '--no-such-option' (see kvdemo --help)\n");
	assert_int_equal(kvt_run(kvt_bin("kvdemo"), missing, out, sizeof(out)), 2);
	assert_string_equal(out, "kvdemo: --prompt-file /nonexistent/q.txt: No such file or directory\n");
	assert_int_equal(kvt_run(kvt_bin("kvdemo"), empty, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "--workload prompts: give prompts with --prompt TEXT or --prompt-file FILE"));
	assert_int_equal(kvt_run(kvt_bin("kvdemo"), nodaemon, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "/nonexistent/kv.sock"));
	assert_non_null(strstr(out, "make run"));
	assert_non_null(strstr(out, "--spawn"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prompt_files_one_process),
		cmocka_unit_test(test_prompt_files_two_processes),
		cmocka_unit_test(test_workload_order),
		cmocka_unit_test(test_external_daemon_geometry),
		cmocka_unit_test(test_schema_example),
		cmocka_unit_test(test_mistakes_named),
		cmocka_unit_test(test_hit_ratio_and_label_match_kvstat),
		cmocka_unit_test(test_daemon_killed_mid_wait),
		cmocka_unit_test(test_share_cap_said_at_that_prompt),
		cmocka_unit_test(test_prompt_labels_distinct),
	};

	return cmocka_run_group_tests_name("integration/kvdemo", tests, setup, teardown);
}
