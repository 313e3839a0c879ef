// SPDX-License-Identifier: MIT
/*
 * tinylm.c - unit tests for the parts of tools/tinylm/ that need no
 * daemon: the forward pass does not depend on how tokens are batched (the
 * property every cache-exactness claim rests on), its math against a
 * plain reference written here, llama2.c checkpoints (a round trip gives
 * the same bits; bad files give errors naming the problem), the byte
 * tokenizer, the schema parser (layout, and file:line:col errors for bad
 * input) and prompt plans.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../tools/tinylm/compose.h"
#include "../../tools/tinylm/schema.h"
#include "../../tools/tinylm/tinylm.h"

static const struct tlm_config tiny = { .dim = 48, .hidden_dim = 72, .n_layers = 2,
					.n_heads = 4, .n_kv_heads = 2, .seq_len = 256 };

static void gen(struct tlm_model *m, const struct tlm_config *cfg, uint64_t seed)
{
	char err[256];

	if (tlm_model_generate(m, cfg, seed, err, sizeof(err)))
		fail_msg("%s", err);
}

static void toks(uint32_t *t, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		t[i] = TLM_BYTE0 + (seed * 2654435761u + i * 40503u) % 256;
}

static void logits_of(const struct tlm_model *m, const uint32_t *t, size_t n, size_t step,
		      float *out)
{
	struct tlm_state s;

	assert_int_equal(tlm_state_init(&s, m, n), 0);
	for (size_t i = 0; i < n; i += step)
		assert_int_equal(tlm_forward(&s, t + i, NULL, NULL, n - i < step ? n - i : step,
					     i + step >= n), 0);
	memcpy(out, s.logits, m->cfg.vocab_size * sizeof(float));
	tlm_state_free(&s);
}

/* One call, token by token, odd chunks: the same bits. */
static void test_batching_does_not_change_bits(void **state)
{
	struct tlm_model m;
	uint32_t t[77];
	float a[TLM_MIN_VOCAB], b[TLM_MIN_VOCAB];
	size_t steps[] = { 1, 3, 7, 32, 33 };

	(void)state;
	gen(&m, &tiny, 3);
	toks(t, 77, 1);
	logits_of(&m, t, 77, 77, a);
	for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
		logits_of(&m, t, 77, steps[k], b);
		assert_memory_equal(a, b, sizeof(a));
	}
	tlm_model_free(&m);
}

/* A plain single-token reference of the llama2.c forward, in double. */
static void reference(const struct tlm_model *m, const uint32_t *t, size_t n, double *out)
{
	int d = m->cfg.dim, kv = m->kv_dim, h = m->cfg.hidden_dim, hs = m->head_dim;
	int L = m->cfg.n_layers, nh = m->cfg.n_heads, grp = nh / m->cfg.n_kv_heads;
	double *K = calloc((size_t)L * n * kv, sizeof(double)), *V = calloc((size_t)L * n * kv, sizeof(double));
	double x[64], xb[64], q[64], k[64], v[64], o[64], hb[128], hb2[128], att[256];

	for (size_t p = 0; p < n; p++) {
		for (int i = 0; i < d; i++)
			x[i] = m->emb[t[p] * d + i];
		for (int l = 0; l < L; l++) {
			double ss = 0;

			for (int i = 0; i < d; i++)
				ss += x[i] * x[i];
			ss = 1 / sqrt(ss / d + 1e-5);
			for (int i = 0; i < d; i++)
				xb[i] = m->rms_att[l * d + i] * ss * x[i];
			for (int j = 0; j < d; j++) {
				q[j] = 0;
				for (int i = 0; i < d; i++)
					q[j] += xb[i] * m->wq[(size_t)l * d * d + i * d + j];
			}
			for (int j = 0; j < kv; j++) {
				k[j] = v[j] = 0;
				for (int i = 0; i < d; i++) {
					k[j] += xb[i] * m->wk[(size_t)l * d * kv + i * kv + j];
					v[j] += xb[i] * m->wv[(size_t)l * d * kv + i * kv + j];
				}
			}
			for (int i = 0; i < d; i += 2) {
				double f = p / pow(10000.0, (i % hs) / (double)hs), c = cos(f), s = sin(f);
				double a = q[i], b = q[i + 1];

				q[i] = a * c - b * s, q[i + 1] = a * s + b * c;
				if (i < kv)
					a = k[i], b = k[i + 1], k[i] = a * c - b * s, k[i + 1] = a * s + b * c;
			}
			memcpy(K + ((size_t)l * n + p) * kv, k, kv * sizeof(double));
			memcpy(V + ((size_t)l * n + p) * kv, v, kv * sizeof(double));
			for (int hh = 0; hh < nh; hh++) {
				double mx = -1e300, sum = 0;
				int off = hh / grp * hs;

				for (size_t j = 0; j <= p; j++) {
					att[j] = 0;
					for (int i = 0; i < hs; i++)
						att[j] += q[hh * hs + i] * K[((size_t)l * n + j) * kv + off + i];
					att[j] /= sqrt(hs);
					mx = att[j] > mx ? att[j] : mx;
				}
				for (size_t j = 0; j <= p; j++)
					sum += (att[j] = exp(att[j] - mx));
				for (int i = 0; i < hs; i++) {
					o[hh * hs + i] = 0;
					for (size_t j = 0; j <= p; j++)
						o[hh * hs + i] += att[j] / sum * V[((size_t)l * n + j) * kv + off + i];
				}
			}
			for (int j = 0; j < d; j++) {
				double acc = 0;

				for (int i = 0; i < d; i++)
					acc += o[i] * m->wo[(size_t)l * d * d + i * d + j];
				x[j] += acc;
			}
			ss = 0;
			for (int i = 0; i < d; i++)
				ss += x[i] * x[i];
			ss = 1 / sqrt(ss / d + 1e-5);
			for (int i = 0; i < d; i++)
				xb[i] = m->rms_ffn[l * d + i] * ss * x[i];
			for (int j = 0; j < h; j++) {
				hb[j] = hb2[j] = 0;
				for (int i = 0; i < d; i++) {
					hb[j] += xb[i] * m->w1[(size_t)l * d * h + i * h + j];
					hb2[j] += xb[i] * m->w3[(size_t)l * d * h + i * h + j];
				}
				hb[j] = hb[j] / (1 + exp(-hb[j])) * hb2[j];
			}
			for (int j = 0; j < d; j++) {
				double acc = 0;

				for (int i = 0; i < h; i++)
					acc += hb[i] * m->w2[(size_t)l * h * d + i * d + j];
				x[j] += acc;
			}
		}
	}
	{
		double ss = 0;

		for (int i = 0; i < d; i++)
			ss += x[i] * x[i];
		ss = 1 / sqrt(ss / d + 1e-5);
		for (int i = 0; i < d; i++)
			xb[i] = m->rms_final[i] * ss * x[i];
		for (int vv = 0; vv < m->cfg.vocab_size; vv++) {
			out[vv] = 0;
			for (int i = 0; i < d; i++)
				out[vv] += xb[i] * m->emb[vv * d + i];
		}
	}
	free(K);
	free(V);
}

static void test_math_matches_reference(void **state)
{
	struct tlm_model m;
	uint32_t t[40];
	float a[TLM_MIN_VOCAB];
	double r[TLM_MIN_VOCAB], err = 0, mag = 0;

	(void)state;
	gen(&m, &tiny, 5);
	toks(t, 40, 9);
	logits_of(&m, t, 40, 40, a);
	reference(&m, t, 40, r);
	for (int i = 0; i < TLM_MIN_VOCAB; i++) {
		err = fmax(err, fabs(a[i] - r[i]));
		mag = fmax(mag, fabs(r[i]));
	}
	assert_true(mag > 0.1);
	assert_true(err < 1e-4 * mag);
	tlm_model_free(&m);
}

static const char *tmpfile_path(void)
{
	static char p[64];

	snprintf(p, sizeof(p), "/tmp/tlm-unit.%d.bin", (int)getpid());
	return p;
}

static void write_file(const char *path, const void *b, size_t n)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(b, 1, n, f), n);
	fclose(f);
}

static void test_checkpoint_round_trip(void **state)
{
	struct tlm_model m, l;
	uint32_t t[30];
	float a[TLM_MIN_VOCAB], b[TLM_MIN_VOCAB];
	char err[256];

	(void)state;
	gen(&m, &tiny, 11);
	toks(t, 30, 2);
	logits_of(&m, t, 30, 30, a);
	for (int shared = 1; shared >= 0; shared--) {
		m.shared_cls = shared;	/* unshared: the classifier copy is written */
		assert_int_equal(tlm_model_save(&m, tmpfile_path()), 0);
		m.shared_cls = 1;
		if (tlm_model_load(&l, tmpfile_path(), err, sizeof(err)))
			fail_msg("%s", err);
		assert_int_equal(l.shared_cls, shared);
		assert_int_equal(l.cfg.vocab_size, TLM_MIN_VOCAB);
		logits_of(&l, t, 30, 30, b);
		assert_memory_equal(a, b, sizeof(a));
		assert_true(!strncmp(l.name, "tinylm-ckpt-", 12));
		tlm_model_free(&l);
	}
	unlink(tmpfile_path());
	tlm_model_free(&m);
}

static void expect_load_error(const void *b, size_t n, int rc, const char *needle)
{
	struct tlm_model l;
	char err[512] = "";

	write_file(tmpfile_path(), b, n);
	assert_int_equal(tlm_model_load(&l, tmpfile_path(), err, sizeof(err)), rc);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not say \"%s\"", err, needle);
	unlink(tmpfile_path());
}

static void test_checkpoint_errors(void **state)
{
	struct tlm_config c = tiny;
	char buf[256] = { 0 };
	struct tlm_model l;
	char err[256] = "";

	(void)state;
	assert_int_equal(tlm_model_load(&l, "/nonexistent/tlm.bin", err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/tlm.bin"));
	expect_load_error(buf, 10, -EINVAL, "shorter than the 28-byte");
	c.vocab_size = 259;
	c.n_heads = 0;
	memcpy(buf, &c, sizeof(c));
	expect_load_error(buf, 200, -EINVAL, "n_heads 0");
	c.n_heads = 5;
	memcpy(buf, &c, sizeof(c));
	expect_load_error(buf, 200, -EINVAL, "must divide dim 48");
	c.n_heads = 4;
	c.n_kv_heads = 3;
	memcpy(buf, &c, sizeof(c));
	expect_load_error(buf, 200, -EINVAL, "n_kv_heads 3");
	c.n_kv_heads = 2;
	c.vocab_size = INT32_MIN;
	memcpy(buf, &c, sizeof(c));
	expect_load_error(buf, 200, -EINVAL, "vocab_size");
	c.vocab_size = -259;	/* unshared, right header, far too short */
	memcpy(buf, &c, sizeof(c));
	expect_load_error(buf, 200, -EINVAL, "200 bytes, but its header");
	/* Generated geometry errors name the field too. */
	c = tiny;
	c.dim = 50;	/* head size 12.5 */
	assert_int_equal(tlm_model_generate(&l, &c, 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "n_heads 4: must divide dim 50"));
}

static void test_forward_refuses_bad_input(void **state)
{
	struct tlm_model m;
	struct tlm_state s;
	uint32_t t[4] = { 5, 6, 7, 8 }, pos[4] = { 0, 1, 2, 256 }, lo[4] = { 0, 0, 3, 0 };

	(void)state;
	gen(&m, &tiny, 1);
	assert_int_equal(tlm_state_init(&s, &m, 4), 0);
	t[1] = TLM_MIN_VOCAB;
	assert_int_equal(tlm_forward(&s, t, NULL, NULL, 4, 1), -EINVAL);	/* token */
	t[1] = 6;
	assert_int_equal(tlm_forward(&s, t, pos, NULL, 4, 1), -EINVAL);	/* position */
	assert_int_equal(tlm_forward(&s, t, NULL, lo, 4, 1), -EINVAL);	/* lo after slot */
	assert_int_equal(tlm_forward(&s, t, NULL, NULL, 0, 1), -EINVAL);
	assert_int_equal(s.n, 0);
	assert_int_equal(tlm_forward(&s, t, NULL, NULL, 4, 1), 0);
	assert_int_equal(tlm_forward(&s, t, NULL, NULL, 1, 1), -ENOSPC);
	tlm_state_free(&s);
	tlm_model_free(&m);
}

/* The page layout kvclient.h fixes: [layer][k|v][token][kv_head][head_dim]. */
static void test_page_layout(void **state)
{
	struct tlm_model m;
	struct tlm_state s, back;
	uint32_t t[20];
	size_t bt = 8, kv, hd, L, page_floats;
	float *page;

	(void)state;
	gen(&m, &tiny, 2);
	kv = m.kv_dim, hd = m.head_dim, L = m.cfg.n_layers;
	page_floats = bt * L * 2 * kv;
	page = malloc(page_floats * sizeof(float));
	toks(t, 20, 4);
	assert_int_equal(tlm_state_init(&s, &m, 20), 0);
	assert_int_equal(tlm_forward(&s, t, NULL, NULL, 20, 0), 0);
	tlm_kv_scatter(&s, 8, page, bt);	/* slots 8..15 */
	for (size_t l = 0; l < L; l++)
		for (size_t tok = 0; tok < bt; tok++)
			for (size_t h = 0; h < (size_t)m.cfg.n_kv_heads; h++)
				for (size_t i = 0; i < hd; i++) {
					size_t off = (((l * 2 + 0) * bt + tok) * m.cfg.n_kv_heads + h) * hd + i;
					size_t st = (l * s.cap + 8 + tok) * kv + h * hd + i;

					assert_true(page[off] == s.kc[st]);
					off = (((l * 2 + 1) * bt + tok) * m.cfg.n_kv_heads + h) * hd + i;
					assert_true(page[off] == s.vc[st]);
				}
	/* And back, into another slot. */
	assert_int_equal(tlm_state_init(&back, &m, 20), 0);
	tlm_kv_gather(&back, 0, page, bt);
	for (size_t l = 0; l < L; l++) {
		assert_memory_equal(back.kc + l * back.cap * kv, s.kc + (l * s.cap + 8) * kv,
				    bt * kv * sizeof(float));
		assert_memory_equal(back.vc + l * back.cap * kv, s.vc + (l * s.cap + 8) * kv,
				    bt * kv * sizeof(float));
	}
	tlm_state_free(&back);
	tlm_state_free(&s);
	free(page);
	tlm_model_free(&m);
}

static void test_tokenizer(void **state)
{
	uint32_t t[8];
	char b[16];

	(void)state;
	assert_int_equal(tlm_tokenize("hi\n", 3, 1, t, 8), 4);
	assert_int_equal(t[0], TLM_BOS);
	assert_int_equal(t[1], TLM_BYTE0 + 'h');
	assert_string_equal(tlm_token_str(t[1], b), "h");
	assert_string_equal(tlm_token_str(t[3], b), "\\n");
	assert_string_equal(tlm_token_str(TLM_BYTE0 + 0xff, b), "<0xFF>");
	assert_string_equal(tlm_token_str(1000, b), "<1000>");
	assert_int_equal(tlm_tokenize("abcdef", 6, 0, t, 2), 2);
}

/* ---- schema ---- */

static void test_schema_layout(void **state)
{
	static const char txt[] =
		"<!-- a comment -->\n<schema name=\"s1\">\n"
		"  <module name=\"a\">  x &lt;y&gt; <param name=\"p\" len=\"4\"/>z </module>\n"
		"  <union><module name=\"b\">12345</module><!-- c --><module name=\"c\">12</module></union>\n"
		"  <module name=\"d\">q</module>\n</schema>\n";
	struct tlm_schema s;
	char err[256];

	(void)state;
	if (tlm_schema_parse(&s, txt, strlen(txt), "t.xml", err, sizeof(err)))
		fail_msg("%s", err);
	assert_string_equal(s.name, "s1");
	assert_int_equal(s.nmods, 4);
	/* "x <y> " (6) + param 4 + "z" (1), trimmed. */
	assert_int_equal(s.mods[0].len, 11);
	assert_int_equal(s.mods[0].segs[0].len, 6);
	assert_memory_equal(s.mods[0].segs[0].text, "x <y> ", 6);
	assert_string_equal(s.mods[0].segs[1].param, "p");
	assert_int_equal(s.mods[1].start, 11);
	assert_int_equal(s.mods[2].start, 11);
	assert_int_equal(s.mods[1].union_id, s.mods[2].union_id);
	assert_int_equal(s.mods[3].start, 16);
	assert_int_equal(s.end, 17);
	assert_int_equal(s.mods[3].union_id, -1);
	tlm_schema_free(&s);
}

static void expect_schema_error(const char *txt, const char *where_what)
{
	struct tlm_schema s;
	char err[256] = "";

	assert_int_equal(tlm_schema_parse(&s, txt, strlen(txt), "bad.xml", err, sizeof(err)),
			 -EINVAL);
	if (!strstr(err, where_what))
		fail_msg("error \"%s\" does not say \"%s\"", err, where_what);
	assert_null(s.mods);
	assert_null(s.name);
}

static void test_schema_errors(void **state)
{
	(void)state;
	expect_schema_error("", "bad.xml:1:1: expected <schema");
	expect_schema_error("<schema>", "bad.xml:1:1: <schema> needs a name attribute");
	expect_schema_error("<schema name=\"x\">", "bad.xml:1:1: <schema> not closed");
	expect_schema_error("<schema name=\"x\"></schema>", "schema x has no modules");
	expect_schema_error("<schema name=\"x\">\n  <module>a</module></schema>",
			    "bad.xml:2:3: <module> needs a name");
	expect_schema_error("<schema name=\"x\">\n<module name=\"m\">abc</schema>",
			    "bad.xml:2:21: unexpected tag in module m");
	expect_schema_error("<schema name=\"x\">\n<module name=\"m\">abc",
			    "bad.xml:2:1: <module name=\"m\"> not closed");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a</module>\n<module name=\"m\">b</module></schema>",
			    "bad.xml:2:15: module m defined twice");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a<param name=\"p\"/></module></schema>",
			    "<param> needs a len attribute");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a<param name=\"p\" len=\"0\"/></module></schema>",
			    "bad.xml:1:57: param p: len \"0\" must be 1..65536");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a<param name=\"p\" len=\"9\" size=\"2\"/></module></schema>",
			    "unknown attribute size");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a &nbsp;</module></schema>",
			    "bad.xml:1:37: unknown entity");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a > b</module></schema>",
			    "'>' in text");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a<b/></module></schema>",
			    "unexpected tag in module m");
	expect_schema_error("<schema name=\"x\">hello<module name=\"m\">a</module></schema>",
			    "bad.xml:1:18: text outside a module");
	expect_schema_error("<schema name=\"x\"><union></union></schema>", "empty <union>");
	expect_schema_error("<schema name=\"x\"><union><union>", "a <union> holds only <module>");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">  </module></schema>",
			    "module m is empty");
	expect_schema_error("<schema name=\"x\"><module name=\"m\">a</module></schema> junk",
			    "text after </schema>");
	expect_schema_error("<schema name=\"x y\">", "character ' ' not allowed");
	expect_schema_error("<schema name=\"x\" name=\"y\">", "attribute name given twice");
	expect_schema_error("<schema name=x>", "bad.xml:1:14: <schema>: expected '\"'");
	expect_schema_error("<!-- open", "comment not closed");
	expect_schema_error("<schema name=\"x\"", "file ends inside the tag");
	/* NUL bytes and no terminator are just bytes. */
	{
		struct tlm_schema s;
		char err[128];

		assert_int_equal(tlm_schema_parse(&s, "<sch\0ema", 8, NULL, err, sizeof(err)),
				 -EINVAL);
		assert_int_equal(tlm_schema_load(&s, "/nonexistent/s.xml", err, sizeof(err)),
				 -ENOENT);
	}
}

static void test_plan(void **state)
{
	static const char txt[] =
		"<schema name=\"s\"><module name=\"a\">ab<param name=\"p\" len=\"3\"/>c</module>"
		"<union><module name=\"u1\">xyz</module><module name=\"u2\">w</module></union>"
		"<module name=\"t\">t</module></schema>";
	struct tlm_schema s;
	struct tlm_plan p;
	struct tlm_arg arg = { "p", "QQ" }, big = { "p", "QQQQ" }, none = { "zz", "1" };
	const char *mods[] = { "t", "a" }, *both[] = { "u1", "u2" }, *twice[] = { "a", "a" };
	const char *unk[] = { "nope" };
	char err[256];
	uint32_t want_pos[] = { 0, 1, 5, 9, 2, 3, 10 }, want_lo[] = { 0, 0, 0, 3, 0, 0, 0 };

	(void)state;
	assert_int_equal(tlm_schema_parse(&s, txt, strlen(txt), "p.xml", err, sizeof(err)), 0);
	/* a: 0..5 (ab, param 2..4, c at 5); u1/u2 at 6; t at 9; end 10. */
	assert_int_equal(tlm_plan_build(&p, &s, mods, 2, &arg, 1, "!", 1, err, sizeof(err)), 0);
	assert_int_equal(p.n, 7);
	assert_int_equal(p.nparts, 2);
	assert_int_equal(p.tail, 4);
	assert_memory_equal(p.pos, want_pos, sizeof(want_pos));
	assert_memory_equal(p.lo, want_lo, sizeof(want_lo));
	assert_int_equal(p.tok[4], TLM_BYTE0 + 'Q');
	assert_int_equal(p.tok[6], TLM_BYTE0 + '!');
	tlm_plan_free(&p);
	assert_int_equal(tlm_plan_build(&p, &s, both, 2, NULL, 0, "!", 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "same union"));
	assert_int_equal(tlm_plan_build(&p, &s, twice, 2, NULL, 0, "!", 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "named twice"));
	assert_int_equal(tlm_plan_build(&p, &s, unk, 1, NULL, 0, "!", 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "no module nope"));
	assert_int_equal(tlm_plan_build(&p, &s, mods, 2, &big, 1, "!", 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "param p of module a holds 3"));
	assert_int_equal(tlm_plan_build(&p, &s, mods, 2, &none, 1, "!", 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "argument zz"));
	{
		struct tlm_arg two[2] = { arg, arg };

		assert_int_equal(tlm_plan_build(&p, &s, mods, 2, two, 2, "!", 1, err, sizeof(err)),
				 -EINVAL);
		assert_non_null(strstr(err, "argument p given twice"));
	}
	assert_int_equal(tlm_plan_build(&p, &s, mods, 2, NULL, 0, "", 0, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "user text"));
	tlm_schema_free(&s);
}

/* Two modules with a param of the same name and different lengths: one
 * argument fills both, so it must fit the shorter (it was checked against
 * the first only, and overflowed the plan: found by review). */
static void test_plan_shared_param_name(void **state)
{
	static const char txt[] =
		"<schema name=\"s\"><module name=\"a\">x<param name=\"who\" len=\"10\"/></module>"
		"<module name=\"b\">y<param name=\"who\" len=\"1\"/>z</module></schema>";
	struct tlm_schema s;
	struct tlm_plan p;
	struct tlm_arg big = { "who", "AAAAAAAAAA" }, fits = { "who", "B" };
	const char *mods[] = { "a", "b" };
	char err[256];

	(void)state;
	assert_int_equal(tlm_schema_parse(&s, txt, strlen(txt), "d.xml", err, sizeof(err)), 0);
	assert_int_equal(tlm_plan_build(&p, &s, mods, 2, &big, 1, "!", 1, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "param who of module b holds 1"));
	assert_int_equal(tlm_plan_build(&p, &s, mods, 2, &fits, 1, "!", 1, err, sizeof(err)), 0);
	/* Module text x, y, z; the argument in both params; the user text. */
	assert_int_equal(p.n, 3 + 2 + 1);
	tlm_plan_free(&p);
	tlm_schema_free(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batching_does_not_change_bits),
		cmocka_unit_test(test_math_matches_reference),
		cmocka_unit_test(test_checkpoint_round_trip),
		cmocka_unit_test(test_checkpoint_errors),
		cmocka_unit_test(test_forward_refuses_bad_input),
		cmocka_unit_test(test_page_layout),
		cmocka_unit_test(test_tokenizer),
		cmocka_unit_test(test_schema_layout),
		cmocka_unit_test(test_schema_errors),
		cmocka_unit_test(test_plan),
		cmocka_unit_test(test_plan_shared_param_name),
	};

	return cmocka_run_group_tests_name("tinylm", tests, NULL, NULL);
}
