// SPDX-License-Identifier: MIT
/*
 * forward.c - the transformer math of tinylm on the CPU, and the copies
 * between kvcached pages and the engine's KV layout.
 *
 * The invariant everything here keeps: the bits of a token's output depend
 * only on its token, its position id and the KV rows it attends to, never
 * on how many tokens run together or where a chunk starts. So every
 * reduction runs in one fixed order per output element: the matmul sums
 * over the input dimension in order (whether the element lies in a 4-row
 * register tile, a 1-row tile or the scalar tail), attention sums over
 * slots in order, and the library is compiled with -ffp-contract=off. This
 * is what makes a warm prefill (KV gathered from pages) bitwise equal to a
 * cold one, and a prompt-module composition equal to a cold prefill with
 * the same positions and mask.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tinylm.h"

/* Tokens run through the layers together (scratch is sized for it). */
#define CHUNK 32

typedef float v4 __attribute__((vector_size(16)));
typedef float v4u __attribute__((vector_size(16), aligned(4)));

static inline v4 ld(const float *p)
{
	return *(const v4u *)p;
}

static inline void st(float *p, v4 v)
{
	*(v4u *)p = v;
}

/*
 * out[t][o] = sum_i x[t][i] * w[i][o], for R rows (1 or 4) and 16 columns
 * from o. Each element: acc = 0, then acc += x*w for i = 0.. in order.
 */
static inline void mm_tile(float *out, const float *x, const float *w, size_t R, size_t I,
			   size_t O, size_t o)
{
	v4 a[4][4];
	size_t i, r;

	memset(a, 0, sizeof(a));

	for (i = 0; i < I; i++) {
		const float *wr = w + i * O + o;
		v4 w0 = ld(wr), w1 = ld(wr + 4), w2 = ld(wr + 8), w3 = ld(wr + 12);

		for (r = 0; r < R; r++) {
			float xv = x[r * I + i];
			v4 xr = { xv, xv, xv, xv };
			a[r][0] += xr * w0;
			a[r][1] += xr * w1;
			a[r][2] += xr * w2;
			a[r][3] += xr * w3;
		}
	}
	for (r = 0; r < R; r++)
		for (i = 0; i < 4; i++)
			st(out + r * O + o + 4 * i, a[r][i]);
}

static void mm_rows(float *out, const float *x, const float *w, size_t R, size_t I, size_t O)
{
	size_t o, r, i;

	for (o = 0; o + 16 <= O; o += 16) {
		if (R == 4)
			mm_tile(out, x, w, 4, I, O, o);
		else
			mm_tile(out, x, w, 1, I, O, o);
	}
	for (; o < O; o++)
		for (r = 0; r < R; r++) {
			float acc = 0.0f;

			for (i = 0; i < I; i++)
				acc += x[r * I + i] * w[i * O + o];
			out[r * O + o] = acc;
		}
}

/* out[T][O] = x[T][I] . w[I][O] */
static void matmul(float *out, const float *x, const float *w, size_t T, size_t I, size_t O)
{
	size_t t = 0;

	for (; t + 4 <= T; t += 4)
		mm_rows(out + t * O, x + t * I, w, 4, I, O);
	for (; t < T; t++)
		mm_rows(out + t * O, x + t * I, w, 1, I, O);
}

static void rmsnorm(float *o, const float *x, const float *w, size_t n)
{
	float ss = 0.0f;
	size_t i;

	for (i = 0; i < n; i++)
		ss += x[i] * x[i];
	ss /= n;
	ss += 1e-5f;
	ss = 1.0f / sqrtf(ss);
	for (i = 0; i < n; i++)
		o[i] = w[i] * (ss * x[i]);
}

static float dot(const float *a, const float *b, size_t n)
{
	size_t i = 0;
	float s;

	if (!(n & 3)) {
		v4 acc = { 0 };

		for (; i < n; i += 4)
			acc += ld(a + i) * ld(b + i);
		return (acc[0] + acc[1]) + (acc[2] + acc[3]);
	}
	for (s = 0.0f; i < n; i++)
		s += a[i] * b[i];
	return s;
}

int tlm_state_init(struct tlm_state *s, const struct tlm_model *m, size_t cap)
{
	size_t d = m->cfg.dim, kv = m->kv_dim, h = m->cfg.hidden_dim, L = m->cfg.n_layers;
	size_t scratch = CHUNK * (5 * d + 2 * kv + 2 * h + m->head_dim);

	memset(s, 0, sizeof(*s));
	if (!cap || cap > (1u << 24))
		return -EINVAL;
	s->m = m;
	s->cap = cap;
	s->kc = malloc(L * cap * kv * sizeof(float));
	s->vc = malloc(L * cap * kv * sizeof(float));
	s->scratch = malloc(scratch * sizeof(float));
	s->att = malloc(cap * sizeof(float));
	s->logits = calloc(m->cfg.vocab_size, sizeof(float));
	if (!s->kc || !s->vc || !s->scratch || !s->att || !s->logits) {
		tlm_state_free(s);
		return -ENOMEM;
	}
	return 0;
}

void tlm_state_free(struct tlm_state *s)
{
	if (!s)
		return;
	free(s->kc);
	free(s->vc);
	free(s->scratch);
	free(s->att);
	free(s->logits);
	memset(s, 0, sizeof(*s));
}

void tlm_state_reset(struct tlm_state *s)
{
	s->n = 0;
}

uint32_t tlm_argmax(const float *l, size_t n)
{
	uint32_t best = 0;

	for (size_t i = 1; i < n; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

/* One chunk of T tokens at slots base.. */
static void run_chunk(struct tlm_state *s, const uint32_t *tok, const uint32_t *pos,
		      const uint32_t *lo, size_t T, size_t base, int want_logits)
{
	const struct tlm_model *m = s->m;
	size_t d = m->cfg.dim, kv = m->kv_dim, h = m->cfg.hidden_dim, hs = m->head_dim;
	size_t L = m->cfg.n_layers, nh = m->cfg.n_heads, grp = nh / m->cfg.n_kv_heads;
	float *x = s->scratch, *xb = x + CHUNK * d, *q = xb + CHUNK * d, *ao = q + CHUNK * d;
	float *xo = ao + CHUNK * d, *k = xo + CHUNK * d, *v = k + CHUNK * kv;
	float *hb = v + CHUNK * kv, *hb2 = hb + CHUNK * h, *rot = hb2 + CHUNK * h;
	float scale = 1.0f / sqrtf((float)hs);
	size_t t, l, i, j, hh;

	for (t = 0; t < T; t++) {
		uint32_t p = pos ? pos[t] : (uint32_t)(base + t);

		memcpy(x + t * d, m->emb + (size_t)tok[t] * d, d * sizeof(float));
		/* RoPE angles (llama2.c: freq = 10000^-(i/hs) for even i). */
		for (i = 0; i < hs; i += 2) {
			float val = p * (1.0f / powf(10000.0f, i / (float)hs));

			rot[t * hs + i] = cosf(val);
			rot[t * hs + i + 1] = sinf(val);
		}
	}
	for (l = 0; l < L; l++) {
		float *kc = s->kc + l * s->cap * kv, *vc = s->vc + l * s->cap * kv;

		for (t = 0; t < T; t++)
			rmsnorm(xb + t * d, x + t * d, m->rms_att + l * d, d);
		matmul(q, xb, m->wq + l * d * d, T, d, d);
		matmul(k, xb, m->wk + l * d * kv, T, d, kv);
		matmul(v, xb, m->wv + l * d * kv, T, d, kv);
		for (t = 0; t < T; t++) {
			const float *r = rot + t * hs;

			for (i = 0; i < d; i += 2) {
				float fcr = r[i % hs], fci = r[i % hs + 1];
				float *vec = q + t * d, v0 = vec[i], v1 = vec[i + 1];

				vec[i] = v0 * fcr - v1 * fci;
				vec[i + 1] = v0 * fci + v1 * fcr;
				if (i < kv) {
					vec = k + t * kv, v0 = vec[i], v1 = vec[i + 1];
					vec[i] = v0 * fcr - v1 * fci;
					vec[i + 1] = v0 * fci + v1 * fcr;
				}
			}
			memcpy(kc + (base + t) * kv, k + t * kv, kv * sizeof(float));
			memcpy(vc + (base + t) * kv, v + t * kv, kv * sizeof(float));
		}
		for (t = 0; t < T; t++) {
			size_t slot = base + t, first = lo ? lo[t] : 0;

			for (hh = 0; hh < nh; hh++) {
				const float *qh = q + t * d + hh * hs;
				size_t off = (hh / grp) * hs;
				float *o = ao + t * d + hh * hs, max, sum = 0.0f;
				float *att = s->att;

				for (j = first; j <= slot; j++)
					att[j] = dot(qh, kc + j * kv + off, hs) * scale;
				max = att[first];
				for (j = first + 1; j <= slot; j++)
					if (att[j] > max)
						max = att[j];
				for (j = first; j <= slot; j++) {
					att[j] = expf(att[j] - max);
					sum += att[j];
				}
				for (j = first; j <= slot; j++)
					att[j] /= sum;
				memset(o, 0, hs * sizeof(float));
				for (j = first; j <= slot; j++) {
					const float *vj = vc + j * kv + off;
					float a = att[j];

					for (i = 0; i < hs; i++)
						o[i] += a * vj[i];
				}
			}
		}
		matmul(xo, ao, m->wo + l * d * d, T, d, d);
		for (i = 0; i < T * d; i++)
			x[i] += xo[i];
		for (t = 0; t < T; t++)
			rmsnorm(xb + t * d, x + t * d, m->rms_ffn + l * d, d);
		matmul(hb, xb, m->w1 + l * d * h, T, d, h);
		matmul(hb2, xb, m->w3 + l * d * h, T, d, h);
		for (i = 0; i < T * h; i++) {
			float val = hb[i];

			val *= 1.0f / (1.0f + expf(-val));
			hb[i] = val * hb2[i];
		}
		matmul(xo, hb, m->w2 + l * h * d, T, h, d);
		for (i = 0; i < T * d; i++)
			x[i] += xo[i];
	}
	if (want_logits) {
		rmsnorm(xb, x + (T - 1) * d, m->rms_final, d);
		matmul(s->logits, xb, m->wcls, 1, d, m->cfg.vocab_size);
	}
}

int tlm_forward(struct tlm_state *s, const uint32_t *tok, const uint32_t *pos,
		const uint32_t *lo, size_t n, int want_logits)
{
	const struct tlm_config *c = &s->m->cfg;
	size_t i, done;

	if (!tok || (!n && want_logits))
		return -EINVAL;
	if (n > s->cap - s->n)
		return -ENOSPC;
	for (i = 0; i < n; i++)
		if (tok[i] >= (uint32_t)c->vocab_size ||
		    (pos && pos[i] >= (uint32_t)c->seq_len) ||
		    (!pos && s->n + i >= (size_t)c->seq_len) || (lo && lo[i] > s->n + i))
			return -EINVAL;
	for (done = 0; done < n; done += CHUNK) {
		size_t T = n - done < CHUNK ? n - done : CHUNK;

		run_chunk(s, tok + done, pos ? pos + done : NULL, lo ? lo + done : NULL, T,
			  s->n, want_logits && done + T == n);
		s->n += T;
	}
	return 0;
}

/* A page holds, per layer, bt K rows then bt V rows of kv_dim floats: the
 * same rows the state keeps per layer, so each is one memcpy. */
void tlm_kv_gather(struct tlm_state *s, size_t slot, const void *page, size_t bt)
{
	size_t kv = s->m->kv_dim, row = bt * kv;
	const float *p = page;

	for (int l = 0; l < s->m->cfg.n_layers; l++, p += 2 * row) {
		memcpy(s->kc + (l * s->cap + slot) * kv, p, row * sizeof(float));
		memcpy(s->vc + (l * s->cap + slot) * kv, p + row, row * sizeof(float));
	}
}

void tlm_kv_scatter(const struct tlm_state *s, size_t slot, void *page, size_t bt)
{
	size_t kv = s->m->kv_dim, row = bt * kv;
	float *p = page;

	for (int l = 0; l < s->m->cfg.n_layers; l++, p += 2 * row) {
		memcpy(p, s->kc + (l * s->cap + slot) * kv, row * sizeof(float));
		memcpy(p + row, s->vc + (l * s->cap + slot) * kv, row * sizeof(float));
	}
}
