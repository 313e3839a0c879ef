// SPDX-License-Identifier: MIT
/*
 * model.c - tinylm weights: drawn from a seed, or read from a llama2.c
 * checkpoint (run.c's format), and written back in that format. Also the
 * byte tokenizer. Weights are kept transposed ([in][out]) for the matmul
 * kernel in forward.c; the file order and layout are llama2.c's.
 *
 * Never trusts a checkpoint: the header's fields are range-checked and the
 * weight count it implies must equal the file's size exactly.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tinylm.h"

static void seterr(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!err || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
}

double tlm_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check_config(const struct tlm_config *c, char *err, size_t len)
{
#define BAD(cond, ...) do { if (cond) { seterr(err, len, __VA_ARGS__); return -EINVAL; } } while (0)
	BAD(c->dim < 2 || c->dim > 16384, "dim %d: must be 2..16384", c->dim);
	BAD(c->hidden_dim < 1 || c->hidden_dim > 65536, "hidden_dim %d: must be 1..65536",
	    c->hidden_dim);
	BAD(c->n_layers < 1 || c->n_layers > 256, "n_layers %d: must be 1..256", c->n_layers);
	BAD(c->n_heads < 1 || c->dim % c->n_heads, "n_heads %d: must divide dim %d", c->n_heads,
	    c->dim);
	BAD((c->dim / c->n_heads) % 2, "head size %d (dim %d / n_heads %d): must be even for RoPE",
	    c->dim / c->n_heads, c->dim, c->n_heads);
	BAD(c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads,
	    "n_kv_heads %d: must divide n_heads %d", c->n_kv_heads, c->n_heads);
	BAD(c->vocab_size < 1 || c->vocab_size > (1 << 20), "vocab_size %d: must be 1..1048576",
	    c->vocab_size);
	BAD(c->seq_len < 1 || c->seq_len > (1 << 22), "seq_len %d: must be 1..4194304",
	    c->seq_len);
#undef BAD
	return 0;
}

/* Floats of the weights in file order (freq_cis tables included, as run.c
 * skips them), and of the classifier when unshared. */
static size_t file_floats(const struct tlm_config *c, int shared)
{
	size_t d = c->dim, h = c->hidden_dim, L = c->n_layers, v = c->vocab_size;
	size_t kv = d / c->n_heads * c->n_kv_heads, hs = d / c->n_heads;

	return v * d + L * d + L * d * d + 2 * L * d * kv + L * d * d + L * d + 3 * L * d * h +
	       d + (size_t)c->seq_len * hs + (shared ? 0 : v * d);
}

/* Point the tensors into m->mem (which holds no freq_cis). */
static int alloc_weights(struct tlm_model *m)
{
	const struct tlm_config *c = &m->cfg;
	size_t d = c->dim, h = c->hidden_dim, L = c->n_layers, v = c->vocab_size;
	size_t kv, total;
	float *p;

	m->head_dim = c->dim / c->n_heads;
	m->kv_dim = m->head_dim * c->n_kv_heads;
	kv = m->kv_dim;
	total = v * d + L * d + L * d * d + 2 * L * d * kv + L * d * d + L * d + 3 * L * d * h + d +
		(m->shared_cls ? 0 : v * d);
	m->mem = malloc(total * sizeof(float));
	if (!m->mem)
		return -ENOMEM;
	p = m->mem;
	m->emb = p, p += v * d;
	m->rms_att = p, p += L * d;
	m->wq = p, p += L * d * d;
	m->wk = p, p += L * d * kv;
	m->wv = p, p += L * d * kv;
	m->wo = p, p += L * d * d;
	m->rms_ffn = p, p += L * d;
	m->w1 = p, p += L * d * h;
	m->w2 = p, p += L * h * d;
	m->w3 = p, p += L * d * h;
	m->rms_final = p, p += d;
	m->wcls = m->shared_cls ? NULL : p;
	if (m->shared_cls) {
		/* The matmul wants [dim][vocab]: a transposed copy. */
		m->wcls = malloc(v * d * sizeof(float));
		if (!m->wcls) {
			free(m->mem);
			m->mem = NULL;
			return -ENOMEM;
		}
	}
	return 0;
}

void tlm_model_free(struct tlm_model *m)
{
	if (!m)
		return;
	if (m->shared_cls)
		free(m->wcls);
	free(m->mem);
	memset(m, 0, sizeof(*m));
}

/*
 * A stream of file-order tensors, each [out][in] in the file, stored here
 * transposed [in][out]; `next` yields the file's floats in order.
 */
struct src {
	float (*next)(struct src *);
	uint64_t state;			/* generator */
	const float *p;			/* file buffer */
	float scale, bias;		/* generator only */
};

static float gen_next(struct src *s)
{
	uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return s->bias + ((float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f) * s->scale; /* [-1,1) */
}

static float file_next(struct src *s)
{
	return *s->p++;
}

static void read_vec(struct src *s, float *dst, size_t n, float scale, float bias)
{
	s->scale = scale;
	s->bias = bias;
	for (size_t i = 0; i < n; i++)
		dst[i] = s->next(s);
}

/* `layers` matrices of [out][in] in file order, stored as [in][out]. */
static void read_mat(struct src *s, float *dst, size_t layers, size_t out, size_t in)
{
	s->scale = 1.0f / sqrtf((float)in);
	s->bias = 0.0f;
	for (size_t l = 0; l < layers; l++, dst += out * in)
		for (size_t o = 0; o < out; o++)
			for (size_t i = 0; i < in; i++)
				dst[i * out + o] = s->next(s);
}

static void read_all(struct tlm_model *m, struct src *s)
{
	const struct tlm_config *c = &m->cfg;
	size_t d = c->dim, h = c->hidden_dim, L = c->n_layers, v = c->vocab_size, kv = m->kv_dim;
	size_t v_i, i;

	read_vec(s, m->emb, v * d, 1.0f, 0.0f);
	read_vec(s, m->rms_att, L * d, 0.1f, 1.0f);
	read_mat(s, m->wq, L, d, d);
	read_mat(s, m->wk, L, kv, d);
	read_mat(s, m->wv, L, kv, d);
	read_mat(s, m->wo, L, d, d);
	read_vec(s, m->rms_ffn, L * d, 0.1f, 1.0f);
	read_mat(s, m->w1, L, h, d);
	read_mat(s, m->w2, L, d, h);
	read_mat(s, m->w3, L, h, d);
	read_vec(s, m->rms_final, d, 0.1f, 1.0f);
	if (s->next == file_next)
		s->p += (size_t)c->seq_len * m->head_dim;	/* freq_cis_real, _imag */
	if (!m->shared_cls)
		read_mat(s, m->wcls, 1, v, d);
	else
		for (v_i = 0; v_i < v; v_i++)
			for (i = 0; i < d; i++)
				m->wcls[i * v + v_i] = m->emb[v_i * d + i];
}

int tlm_model_generate(struct tlm_model *m, const struct tlm_config *cfg, uint64_t seed,
		       char *err, size_t errlen)
{
	struct src s = { .next = gen_next, .state = seed };
	int rc;

	memset(m, 0, sizeof(*m));
	m->cfg = *cfg;
	if (!m->cfg.vocab_size)
		m->cfg.vocab_size = TLM_MIN_VOCAB;
	m->shared_cls = 1;
	rc = check_config(&m->cfg, err, errlen);
	if (rc)
		return rc;
	rc = alloc_weights(m);
	if (rc) {
		seterr(err, errlen, "out of memory for the weights");
		return rc;
	}
	read_all(m, &s);
	snprintf(m->name, sizeof(m->name), "tinylm-s%llu-L%d-d%d-h%d-H%d-K%d-V%d",
		 (unsigned long long)seed, cfg->n_layers, cfg->dim, cfg->hidden_dim,
		 cfg->n_heads, cfg->n_kv_heads, m->cfg.vocab_size);
	return 0;
}

int tlm_model_load(struct tlm_model *m, const char *path, char *err, size_t errlen)
{
	struct src s = { .next = file_next };
	struct stat st;
	float *buf = NULL;
	size_t want, got = 0;
	uint64_t h = 0xcbf29ce484222325ull;
	int fd, rc;
	ssize_t r;

	memset(m, 0, sizeof(*m));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		seterr(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st)) {
		rc = -errno;
		seterr(err, errlen, "%s: %s", path, strerror(errno));
		goto out_close;
	}
	rc = -EINVAL;
	if (!S_ISREG(st.st_mode)) {
		seterr(err, errlen, "%s: not a regular file", path);
		goto out_close;
	}
	if ((size_t)st.st_size < sizeof(m->cfg)) {
		seterr(err, errlen, "%s: %lld bytes, shorter than the 28-byte llama2.c header",
		       path, (long long)st.st_size);
		goto out_close;
	}
	if (pread(fd, &m->cfg, sizeof(m->cfg), 0) != (ssize_t)sizeof(m->cfg)) {
		seterr(err, errlen, "%s: cannot read the header", path);
		goto out_close;
	}
	m->shared_cls = m->cfg.vocab_size > 0;
	if (m->cfg.vocab_size < 0 && m->cfg.vocab_size != INT32_MIN)
		m->cfg.vocab_size = -m->cfg.vocab_size;
	if (check_config(&m->cfg, err, errlen)) {
		char tmp[160];

		snprintf(tmp, sizeof(tmp), "%s", err ? err : "");
		seterr(err, errlen, "%s: llama2.c header: %s", path, tmp);
		goto out_close;
	}
	want = file_floats(&m->cfg, m->shared_cls) * sizeof(float) + sizeof(m->cfg);
	if ((size_t)st.st_size != want) {
		seterr(err, errlen,
		       "%s: %lld bytes, but its header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, vocab_size %d%s, seq_len %d) needs %zu",
		       path, (long long)st.st_size, m->cfg.dim, m->cfg.hidden_dim,
		       m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.vocab_size,
		       m->shared_cls ? "" : " unshared", m->cfg.seq_len, want);
		goto out_close;
	}
	buf = malloc(want - sizeof(m->cfg));
	if (!buf || alloc_weights(m)) {
		rc = -ENOMEM;
		seterr(err, errlen, "%s: out of memory for %zu bytes of weights", path, want);
		goto out_free;
	}
	while (got < want - sizeof(m->cfg)) {
		r = pread(fd, (char *)buf + got, want - sizeof(m->cfg) - got,
			  sizeof(m->cfg) + got);
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			seterr(err, errlen, "%s: read: %s", path, r < 0 ? strerror(errno) : "short");
			goto out_free;
		}
		got += r;
	}
	s.p = buf;
	read_all(m, &s);
	/* The namespace names the weights: FNV-1a of the whole file, header
	 * included (the same weight bytes read with another header are
	 * another model). */
	h = (h ^ (uint64_t)st.st_size) * 0x100000001b3ull;
	for (size_t i = 0; i < sizeof(m->cfg); i++)
		h = (h ^ ((const unsigned char *)&m->cfg)[i]) * 0x100000001b3ull;
	h = (h ^ (uint64_t)m->shared_cls) * 0x100000001b3ull;	/* the sign of vocab */
	for (size_t i = 0; i < got; i++)
		h = (h ^ ((const unsigned char *)buf)[i]) * 0x100000001b3ull;
	snprintf(m->name, sizeof(m->name), "tinylm-ckpt-%016llx-L%d-d%d", (unsigned long long)h,
		 m->cfg.n_layers, m->cfg.dim);
	free(buf);
	close(fd);
	return 0;
out_free:
	free(buf);
	tlm_model_free(m);
out_close:
	close(fd);
	return rc;
}

static int put_vec(FILE *f, const float *p, size_t n)
{
	return fwrite(p, sizeof(float), n, f) == n ? 0 : -EIO;
}

static int put_mat(FILE *f, const float *p, size_t layers, size_t out, size_t in)
{
	for (size_t l = 0; l < layers; l++, p += out * in)
		for (size_t o = 0; o < out; o++)
			for (size_t i = 0; i < in; i++)
				if (fwrite(&p[i * out + o], sizeof(float), 1, f) != 1)
					return -EIO;
	return 0;
}

int tlm_model_save(const struct tlm_model *m, const char *path)
{
	const struct tlm_config *c = &m->cfg;
	struct tlm_config hdr = *c;
	size_t d = c->dim, h = c->hidden_dim, L = c->n_layers, kv = m->kv_dim;
	size_t nfreq = (size_t)c->seq_len * m->head_dim / 2;
	FILE *f = fopen(path, "wb");
	int rc = 0;

	if (!f)
		return -errno;
	if (!m->shared_cls)
		hdr.vocab_size = -hdr.vocab_size;
	if (fwrite(&hdr, sizeof(hdr), 1, f) != 1)
		rc = -EIO;
	rc = rc ?: put_vec(f, m->emb, c->vocab_size * d);
	rc = rc ?: put_vec(f, m->rms_att, L * d);
	rc = rc ?: put_mat(f, m->wq, L, d, d);
	rc = rc ?: put_mat(f, m->wk, L, kv, d);
	rc = rc ?: put_mat(f, m->wv, L, kv, d);
	rc = rc ?: put_mat(f, m->wo, L, d, d);
	rc = rc ?: put_vec(f, m->rms_ffn, L * d);
	rc = rc ?: put_mat(f, m->w1, L, h, d);
	rc = rc ?: put_mat(f, m->w2, L, d, h);
	rc = rc ?: put_mat(f, m->w3, L, h, d);
	rc = rc ?: put_vec(f, m->rms_final, d);
	for (size_t i = 0; !rc && i < 2 * nfreq; i++) {
		/* freq_cis real then imag, as llama2.c's export writes them. */
		size_t p = (i % nfreq) / (m->head_dim / 2), j = (i % nfreq) % (m->head_dim / 2);
		float fr = (float)p / powf(10000.0f, 2.0f * j / m->head_dim);
		float v = i < nfreq ? cosf(fr) : sinf(fr);

		rc = put_vec(f, &v, 1);
	}
	if (!rc && !m->shared_cls)
		rc = put_mat(f, m->wcls, 1, c->vocab_size, d);
	if (fclose(f) && !rc)
		rc = -EIO;
	return rc;
}

struct kvc_model tlm_kvc_model(const struct tlm_model *m, uint32_t block_tokens)
{
	struct kvc_model k = {
		.size = sizeof(k),
		.name = m->name,
		.dtype_bytes = 4,
		.layers = m->cfg.n_layers,
		.kv_heads = m->cfg.n_kv_heads,
		.head_dim = m->head_dim,
		.block_tokens = block_tokens,
		.pos_kind = KVC_POS_ROPE,
	};
	return k;
}

size_t tlm_tokenize(const char *text, size_t len, int bos, uint32_t *out, size_t max)
{
	size_t n = 0;

	if (bos && n < max)
		out[n++] = TLM_BOS;
	for (size_t i = 0; i < len && n < max; i++)
		out[n++] = TLM_BYTE0 + (unsigned char)text[i];
	return n;
}

const char *tlm_token_str(uint32_t tok, char *buf)
{
	if (tok >= TLM_BYTE0 && tok < TLM_BYTE0 + 256) {
		unsigned char b = tok - TLM_BYTE0;

		if (b >= 32 && b < 127)
			snprintf(buf, 16, "%c", b);
		else if (b == '\n')
			snprintf(buf, 16, "\\n");
		else
			snprintf(buf, 16, "<0x%02X>", b);
	} else {
		snprintf(buf, 16, "<%u>", tok);
	}
	return buf;
}
