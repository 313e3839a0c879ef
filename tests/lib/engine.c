// SPDX-License-Identifier: MIT
/*
 * engine.c - see engine.h. Addresses are computed element by element from
 * the layouts kvclient.h documents, independently of kernels/page_ref.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static uint8_t background(uint32_t layer, uint64_t off)
{
	return (uint8_t)(0x5a ^ (off * 13) ^ (off >> 11) ^ layer);
}

/* Byte `in` of layer/half s of the block whose key is `key`. */
static uint8_t kv_byte(struct kvc_key key, uint32_t layer, int s, uint64_t in)
{
	uint64_t seed = mix(key.lo ^ mix(key.hi + layer * 2u + (uint64_t)s) ^ (in >> 3));

	return (uint8_t)(seed >> ((in & 7) * 8));
}

int kvt_engine_new(struct kvt_engine *e, const struct kvc_model *m, uint32_t kind,
		   uint64_t num_blocks, uint64_t pad)
{
	uint32_t l;
	uint64_t o;

	memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->layers = m->layers;
	e->num_blocks = num_blocks;
	e->kv_heads = m->kv_heads;
	e->head_dim = m->head_dim;
	e->bt = m->block_tokens;
	e->dt = m->dtype_bytes;
	e->half = (uint64_t)e->bt * e->kv_heads * e->head_dim * e->dt;
	e->stride = e->half + pad;
	e->tensor_bytes = num_blocks * e->stride * (kind == KVC_LAYOUT_FLASH ? 2 : 1);
	e->k = calloc(e->layers, sizeof(*e->k));
	e->v = calloc(e->layers, sizeof(*e->v));
	if (!e->k || !e->v)
		goto fail;
	for (l = 0; l < e->layers; l++) {
		e->k[l] = malloc(e->tensor_bytes);
		if (!e->k[l])
			goto fail;
		for (o = 0; o < e->tensor_bytes; o++)
			e->k[l][o] = background(l, o);
		if (kind == KVC_LAYOUT_KV) {
			e->v[l] = malloc(e->tensor_bytes);
			if (!e->v[l])
				goto fail;
			for (o = 0; o < e->tensor_bytes; o++)
				e->v[l][o] = background(l + 1000, o);
		}
	}
	return 0;
fail:
	kvt_engine_free(e);
	return -ENOMEM;
}

void kvt_engine_free(struct kvt_engine *e)
{
	uint32_t l;

	for (l = 0; e->k && l < e->layers; l++)
		free(e->k[l]);
	for (l = 0; e->v && l < e->layers; l++)
		free(e->v[l]);
	free(e->k);
	free(e->v);
	memset(e, 0, sizeof(*e));
}

/* Tensor byte offset of element byte (t, h, d, x) of block b, half s. */
static uint8_t *at(const struct kvt_engine *e, uint32_t l, int s, uint64_t b, uint32_t t,
		   uint32_t h, uint32_t d, uint32_t x)
{
	uint64_t in = (((uint64_t)t * e->kv_heads + h) * e->head_dim + d) * e->dt + x;

	if (e->kind == KVC_LAYOUT_FLASH)
		return e->k[l] + (uint64_t)s * e->num_blocks * e->stride + b * e->stride + in;
	return (s ? e->v[l] : e->k[l]) + b * e->stride + in;
}

#define EACH_BYTE(e)                                                      \
	for (uint32_t l = 0; l < (e)->layers; l++)                         \
		for (int s = 0; s < 2; s++)                                \
			for (uint32_t t = 0; t < (e)->bt; t++)             \
				for (uint32_t h = 0; h < (e)->kv_heads; h++) \
					for (uint32_t d = 0; d < (e)->head_dim; d++) \
						for (uint32_t x = 0; x < (e)->dt; x++)

static uint64_t elem(const struct kvt_engine *e, uint32_t t, uint32_t h, uint32_t d, uint32_t x)
{
	return (((uint64_t)t * e->kv_heads + h) * e->head_dim + d) * e->dt + x;
}

void kvt_engine_put(struct kvt_engine *e, uint64_t b, struct kvc_key key)
{
	EACH_BYTE(e)
		*at(e, l, s, b, t, h, d, x) = kv_byte(key, l, s, elem(e, t, h, d, x));
}

bool kvt_engine_layer_has(const struct kvt_engine *e, uint64_t b, uint32_t l,
			  struct kvc_key key)
{
	for (int s = 0; s < 2; s++)
		for (uint32_t t = 0; t < e->bt; t++)
			for (uint32_t h = 0; h < e->kv_heads; h++)
				for (uint32_t d = 0; d < e->head_dim; d++)
					for (uint32_t x = 0; x < e->dt; x++)
						if (*at(e, l, s, b, t, h, d, x) !=
						    kv_byte(key, l, s, elem(e, t, h, d, x)))
							return false;
	return true;
}

bool kvt_engine_has(const struct kvt_engine *e, uint64_t b, struct kvc_key key)
{
	for (uint32_t l = 0; l < e->layers; l++)
		if (!kvt_engine_layer_has(e, b, l, key))
			return false;
	/* The padding after the block stays the background. */
	for (uint32_t l = 0; l < e->layers; l++)
		for (int s = 0; s < 2; s++) {
			uint8_t *p = at(e, l, s, b, 0, 0, 0, 0);
			const uint8_t *base = e->kind == KVC_LAYOUT_KV && s ? e->v[l] : e->k[l];
			uint32_t bl = e->kind == KVC_LAYOUT_KV && s ? l + 1000 : l;

			for (uint64_t o = e->half; o < e->stride; o++)
				if (p[o] != background(bl, (uint64_t)(p - base) + o))
					return false;
		}
	return true;
}

bool kvt_engine_untouched(const struct kvt_engine *e, uint64_t b)
{
	uint32_t l;
	uint64_t o;
	int s;

	for (l = 0; l < e->layers; l++)
		for (s = 0; s < 2; s++) {
			const uint8_t *base = e->kind == KVC_LAYOUT_FLASH ? e->k[l] : s ? e->v[l] : e->k[l];
			uint64_t from = (e->kind == KVC_LAYOUT_FLASH ? (uint64_t)s * e->num_blocks * e->stride : 0) +
					b * e->stride;
			uint32_t bl = e->kind == KVC_LAYOUT_KV && s ? l + 1000 : l;

			for (o = from; o < from + e->stride; o++)
				if (base[o] != background(bl, o))
					return false;
		}
	return true;
}

struct kvc_layout kvt_engine_layout(const struct kvt_engine *e, void *const *t_k,
				    void *const *t_v)
{
	struct kvc_layout l = {
		.size = sizeof(l), .kind = e->kind, .layers = e->layers,
		.num_blocks = e->num_blocks, .block_stride = e->stride == e->half ? 0 : e->stride,
		.k = t_k, .v = e->kind == KVC_LAYOUT_KV ? t_v : NULL,
	};
	return l;
}

static kvc_t *open_model(const char *sock, const struct kvc_model *m, const struct kvt_mem *mem)
{
	struct kvc_options o = { .size = sizeof(o), .socket_path = sock };
	kvc_t *c = NULL;

	if (kvc_open(m, &o, &c))
		return NULL;
	if (mem && mem->prepare && kvc_gpu_prepare(c, mem->device, mem->prepare_flags)) {
		kvc_close(c);
		return NULL;
	}
	return c;
}

static struct kvc_layout layout_of(const struct kvt_engine *e, const struct kvt_mem *mem,
				   void *const *tk, void *const *tv)
{
	struct kvc_layout l = kvt_engine_layout(e, mem ? tk : (void *const *)e->k,
						mem ? tv : (void *const *)e->v);

	if (mem && mem->device_layout) {
		l.flags = KVC_LAYOUT_DEVICE;
		l.device = mem->device;
	}
	return l;
}

#define MAXB 64

int kvt_engine_publish(const char *sock, const struct kvc_model *m, const uint32_t *t,
		       size_t n, uint32_t kind, const struct kvt_mem *mem)
{
	kvc_t *c = open_model(sock, m, mem);
	struct kvc_key keys[MAXB];
	struct kvt_engine e;
	struct kvc_req *r = NULL;
	void *tk[64], *tv[64];
	int64_t ids[MAXB];
	struct kvc_layout l;
	int nb, rc = -1001, i;

	if (!c)
		return -1001;
	nb = kvc_keys(c, t, n, NULL, 0, keys, MAXB);
	if (nb < 2 || nb > MAXB || m->layers > 64 ||
	    kvt_engine_new(&e, m, kind, 2u * (unsigned)nb + 3, 0)) {
		kvc_close(c);
		return -1002;
	}
	/* Engine blocks 2i+1, in reverse: scattered, not monotonic. */
	for (i = 0; i < nb; i++) {
		ids[i] = 2 * (nb - 1 - i) + 1;
		kvt_engine_put(&e, (uint64_t)ids[i], keys[i]);
	}
	if (kvc_req_new(c, t, n, NULL, 0, &r) || (rc = -1003, kvc_lookup(r) != 0) ||
	    (rc = -1004, kvc_alloc(r) != nb))
		goto out;
	rc = -1005;
	if (mem && mem->upload(&e, tk, tv))
		goto out;
	l = layout_of(&e, mem, tk, tv);
	/* Two partial runs: block 0, then the rest. */
	if (kvc_scatter(r, 0, 1, &l, ids, mem ? mem->stream : NULL) ||
	    kvc_scatter(r, 1, (size_t)nb - 1, &l, ids + 1, mem ? mem->stream : NULL))
		rc = -1006;
	if (mem && (mem->sync(mem->stream) || mem->download(&e, tk, tv)))
		rc = -1007;
	if (rc == -1005)
		rc = kvc_publish(r);
out:
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
	return rc;
}

int kvt_engine_fetch(const char *sock, const struct kvc_model *m, const uint32_t *t,
		     size_t n, uint32_t kind, const struct kvt_mem *mem)
{
	kvc_t *c = open_model(sock, m, mem);
	struct kvc_key keys[MAXB];
	struct kvt_engine e;
	struct kvc_req *r = NULL;
	void *tk[64], *tv[64];
	int64_t ids[MAXB];
	struct kvc_layout l;
	int nb, rc, i;
	uint64_t b;

	if (!c)
		return -1001;
	nb = kvc_keys(c, t, n, NULL, 0, keys, MAXB);
	/* 24 bytes of padding between blocks, 2 spare engine blocks. */
	if (nb < 1 || nb > MAXB || m->layers > 64 ||
	    kvt_engine_new(&e, m, kind, (unsigned)nb + 2, 24)) {
		kvc_close(c);
		return -1002;
	}
	/* Engine blocks 1, 3, 5, ..., then 0, 2, 4, ...: scattered. */
	{
		int64_t want = 1;

		for (i = 0; i < nb; i++) {
			if (want >= nb + 2)
				want = 0;
			ids[i] = want;
			want += 2;
		}
	}
	rc = -1003;
	if (kvc_req_new(c, t, n, NULL, 0, &r) || kvc_lookup(r) != nb)
		goto out;
	rc = -1005;
	if (mem && mem->upload(&e, tk, tv))
		goto out;
	l = layout_of(&e, mem, tk, tv);
	if (mem && mem->gather)
		rc = mem->gather(r, (size_t)nb, &l, ids, mem->stream) ? -1006 : 0;
	else
		rc = kvc_gather(r, 0, (size_t)nb, &l, ids, mem ? mem->stream : NULL) ? -1006 : 0;
	if (mem && (mem->sync(mem->stream) || mem->download(&e, tk, tv)))
		rc = -1007;
	if (rc)
		goto out;
	for (b = 0; b < e.num_blocks; b++) {
		for (i = 0; i < nb && (uint64_t)ids[i] != b; i++)
			;
		if (i < nb ? !kvt_engine_has(&e, b, keys[i]) : !kvt_engine_untouched(&e, b)) {
			rc = -1008;
			goto out;
		}
	}
out:
	kvc_req_free(r);
	kvt_engine_free(&e);
	kvc_close(c);
	return rc;
}
