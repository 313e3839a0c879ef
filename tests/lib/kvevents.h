/* SPDX-License-Identifier: MIT */
/*
 * kvevents.h - a strict decoder of KV event batches for the C tests and
 * the events fuzz target, written from the field lists of vLLM's msgspec
 * structs (docs/EVENTS.md names the versions read), in both encodings:
 * each event a tagged array (array_like, vLLM up to 0.23) or a map with
 * the tag under "type" (0.24 on), the batch an array either way. Checked
 * the way msgspec's decoder checks them, tags, required fields and
 * types, with nothing left over; stricter in one thing: a map field the
 * structs do not declare is refused (msgspec ignores it), so the tests
 * see kvcached send nothing else. The Python suite
 * (tests/python/test_kv_events.py) has its own copy of the same rules.
 * Uses msgpack-c's unpacker: link -lmsgpackc.
 */
#ifndef KVT_KVEVENTS_H
#define KVT_KVEVENTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "../../shm/proto.h"

enum { KVE_STORED, KVE_REMOVED, KVE_CLEARED };
enum { KVE_HASH_UINT, KVE_HASH_INT, KVE_HASH_BYTES };

struct kve_hash {
	int form;		/* KVE_HASH_*: how it was written */
	uint64_t lo, hi;	/* int forms: lo is the value's bits, hi 0 */
};

struct kve_ev {
	int type;
	uint32_t n;		/* block hashes */
	struct kve_hash *hash;
	bool has_parent;
	struct kve_hash parent;
	uint32_t ntok;
	uint32_t *tok;
	uint64_t block_size;
	bool has_medium;
	char medium[32];
	bool map;		/* written as a map (else a tagged array) */
	uint32_t optional;	/* fields with a default that it carries */
};

struct kve_batch {
	double ts;
	bool has_rank;
	int64_t rank;
	uint32_t n;
	struct kve_ev *ev;
};

static inline void kve_free(struct kve_batch *b)
{
	uint32_t i;

	for (i = 0; b->ev && i < b->n; i++) {
		free(b->ev[i].hash);
		free(b->ev[i].tok);
	}
	free(b->ev);
	memset(b, 0, sizeof(*b));
}

#define KVE_FAIL(w) do { *why = (w); return -1; } while (0)

static inline int kve_hash(const msgpack_object *o, struct kve_hash *h, const char **why)
{
	memset(h, 0, sizeof(*h));
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		h->form = KVE_HASH_UINT;
		h->lo = o->via.u64;
	} else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		h->form = KVE_HASH_INT;
		h->lo = (uint64_t)o->via.i64;
	} else if (o->type == MSGPACK_OBJECT_BIN) {
		uint32_t i, n = o->via.bin.size;

		/* ExternalBlockHash = bytes | int: any length decodes; the int
		 * form of bytes is their last 8, big-endian (vLLM's rule). */
		h->form = KVE_HASH_BYTES;
		for (i = 0; i < n; i++) {
			uint8_t c = (uint8_t)o->via.bin.ptr[i];

			if (n - i > 8)
				h->hi = h->hi << 8 | c;
			else
				h->lo = h->lo << 8 | c;
		}
	} else {
		KVE_FAIL("a block hash is neither an int nor bytes");
	}
	return 0;
}

static inline int kve_str(const msgpack_object *o, char *out, size_t len, bool *has,
			  const char **why)
{
	*has = false;
	out[0] = 0;
	if (o->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (o->type != MSGPACK_OBJECT_STR)
		KVE_FAIL("expected str or None");
	*has = true;
	if (o->via.str.size >= len)
		KVE_FAIL("string too long for this test decoder");
	memcpy(out, o->via.str.ptr, o->via.str.size);
	out[o->via.str.size] = 0;
	return 0;
}

static inline bool kve_tag(const msgpack_object *o, const char *tag)
{
	return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(tag) &&
	       !memcmp(o->via.str.ptr, tag, o->via.str.size);
}

static inline int kve_hashes(const msgpack_object *o, struct kve_ev *e, const char **why)
{
	uint32_t i;

	if (o->type != MSGPACK_OBJECT_ARRAY)
		KVE_FAIL("block_hashes is not an array");
	e->n = o->via.array.size;
	e->hash = calloc(e->n ? e->n : 1, sizeof(*e->hash));
	if (!e->hash)
		KVE_FAIL("out of memory");
	for (i = 0; i < e->n; i++)
		if (kve_hash(&o->via.array.ptr[i], &e->hash[i], why))
			return -1;
	return 0;
}

static inline bool kve_is_int(const msgpack_object *o)
{
	return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
	       o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

/*
 * The fields of vLLM's event structs in declaration order (kv_events.py;
 * EVENTS.md names the commits read): the first `required` have no
 * default; the others default to None and msgspec leaves them out when
 * they are. The array form (array_like=True, vLLM up to 0.23) writes them
 * by position after the tag and may end after any field from `required`
 * on; it has no field past `array_max`. The map form (0.24 on) names them,
 * the tag under "type".
 */
struct kve_kind {
	const char *tag;
	int type;
	uint32_t required, array_max;
	const char *const *fields;
};

static const char *const kve_stored_fields[] = {
	"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
	"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
	"kv_cache_spec_sliding_window", "locality", NULL,
};
static const char *const kve_removed_fields[] = {
	"block_hashes", "medium", "group_idx", "locality", NULL,
};
static const char *const kve_no_fields[] = { NULL };

static const struct kve_kind kve_kinds[] = {
	{ "BlockStored", KVE_STORED, 7, 11, kve_stored_fields },
	{ "BlockRemoved", KVE_REMOVED, 2, 3, kve_removed_fields },
	{ "AllBlocksCleared", KVE_CLEARED, 0, 0, kve_no_fields },
};

#define KVE_MAXF 12

/* Event o's fields into v[] by declaration index (NULL: absent). */
static inline int kve_fields(const msgpack_object *o, struct kve_ev *e,
			     const struct kve_kind **kind, const msgpack_object **v,
			     const char **why)
{
	const msgpack_object *tag;
	uint32_t i, k, nf;

	memset(v, 0, KVE_MAXF * sizeof(*v));
	if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size) {
		tag = &o->via.array.ptr[0];
	} else if (o->type == MSGPACK_OBJECT_MAP) {
		e->map = true;
		tag = NULL;
		for (i = 0; i < o->via.map.size; i++)
			if (kve_tag(&o->via.map.ptr[i].key, "type")) {
				if (tag)
					KVE_FAIL("\"type\" twice");
				tag = &o->via.map.ptr[i].val;
			}
		if (!tag)
			KVE_FAIL("an event map has no \"type\"");
	} else {
		KVE_FAIL("an event is neither a tagged array nor a map");
	}
	*kind = NULL;
	for (k = 0; k < sizeof(kve_kinds) / sizeof(kve_kinds[0]); k++)
		if (kve_tag(tag, kve_kinds[k].tag))
			*kind = &kve_kinds[k];
	if (!*kind)
		KVE_FAIL("unknown event tag");
	for (nf = 0; (*kind)->fields[nf]; nf++)
		;
	if (!e->map) {
		uint32_t n = o->via.array.size - 1;

		if (n < (*kind)->required || n > (*kind)->array_max)
			KVE_FAIL("an array event has a wrong number of fields");
		for (i = 0; i < n; i++)
			v[i] = &o->via.array.ptr[i + 1];
		return 0;
	}
	for (i = 0; i < o->via.map.size; i++) {
		const msgpack_object *key = &o->via.map.ptr[i].key;

		if (key->type != MSGPACK_OBJECT_STR)
			KVE_FAIL("a map key is not a str");
		if (kve_tag(key, "type"))
			continue;
		for (k = 0; k < nf && !kve_tag(key, (*kind)->fields[k]); k++)
			;
		if (k == nf)
			KVE_FAIL("a field the struct does not declare");
		if (v[k])
			KVE_FAIL("a field twice");
		v[k] = &o->via.map.ptr[i].val;
	}
	for (k = 0; k < (*kind)->required; k++)
		if (!v[k])
			KVE_FAIL("a field without a default is missing");
	return 0;
}

static inline int kve_event(const msgpack_object *o, struct kve_ev *e, const char **why)
{
	const struct kve_kind *kind;
	const msgpack_object *v[KVE_MAXF];
	char buf[64];
	bool has;
	uint32_t i, k;

	memset(e, 0, sizeof(*e));
	if (kve_fields(o, e, &kind, v, why))
		return -1;
	e->type = kind->type;
	for (k = kind->required; kind->fields[k]; k++)
		e->optional += v[k] != NULL;
	if (e->type == KVE_CLEARED)
		return 0;
	if (kve_hashes(v[0], e, why))
		return -1;
	if (e->type == KVE_REMOVED) {
		/* block_hashes, medium, group_idx, locality */
		if (kve_str(v[1], e->medium, sizeof(e->medium), &e->has_medium, why))
			return -1;
		if (v[2] && v[2]->type != MSGPACK_OBJECT_NIL && !kve_is_int(v[2]))
			KVE_FAIL("group_idx is not an int or None");
		if (v[3] && kve_str(v[3], buf, sizeof(buf), &has, why))
			return -1;
		return 0;
	}
	/* block_hashes, parent_block_hash, token_ids, block_size, lora_id,
	 * medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
	 * kv_cache_spec_sliding_window, locality */
	if (v[1]->type != MSGPACK_OBJECT_NIL) {
		e->has_parent = true;
		if (kve_hash(v[1], &e->parent, why))
			return -1;
	}
	if (v[2]->type != MSGPACK_OBJECT_ARRAY)
		KVE_FAIL("token_ids is not an array");
	e->ntok = v[2]->via.array.size;
	e->tok = calloc(e->ntok ? e->ntok : 1, sizeof(*e->tok));
	if (!e->tok)
		KVE_FAIL("out of memory");
	for (i = 0; i < e->ntok; i++) {
		const msgpack_object *t = &v[2]->via.array.ptr[i];

		if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
			KVE_FAIL("a token id is not an int in 0..2^32-1");
		e->tok[i] = (uint32_t)t->via.u64;
	}
	if (v[3]->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		KVE_FAIL("block_size is not a positive int");
	e->block_size = v[3]->via.u64;
	if (v[4]->type != MSGPACK_OBJECT_NIL && !kve_is_int(v[4]))
		KVE_FAIL("lora_id is not an int or None");
	if (kve_str(v[5], e->medium, sizeof(e->medium), &e->has_medium, why) ||
	    kve_str(v[6], buf, sizeof(buf), &has, why))
		return -1;
	if (v[7] && v[7]->type != MSGPACK_OBJECT_NIL) {
		if (v[7]->type != MSGPACK_OBJECT_ARRAY)
			KVE_FAIL("extra_keys is not an array or None");
		for (i = 0; i < v[7]->via.array.size; i++) {
			int t = v[7]->via.array.ptr[i].type;

			if (t != MSGPACK_OBJECT_NIL && t != MSGPACK_OBJECT_ARRAY)
				KVE_FAIL("an extra_keys entry is not a tuple or None");
		}
	}
	for (k = 8; k <= 10; k += 2)	/* group_idx, kv_cache_spec_sliding_window */
		if (v[k] && v[k]->type != MSGPACK_OBJECT_NIL && !kve_is_int(v[k]))
			KVE_FAIL("group_idx or the sliding window is not an int or None");
	if ((v[9] && kve_str(v[9], buf, sizeof(buf), &has, why)) ||
	    (v[11] && kve_str(v[11], buf, sizeof(buf), &has, why)))
		return -1;
	return 0;
}

/* Decode one payload; 0, or -1 with *why (b is freed either way on -1). */
static inline int kve_decode(const void *p, size_t len, struct kve_batch *b, const char **why)
{
	msgpack_unpacked u;
	const msgpack_object *o, *ev;
	size_t off = 0;
	uint32_t i;
	int rc = -1;

	memset(b, 0, sizeof(*b));
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, p, len, &off) != MSGPACK_UNPACK_SUCCESS) {
		*why = "not one msgpack object";
		goto out;
	}
	if (off != len) {
		*why = "trailing bytes after the batch";
		goto out;
	}
	o = &u.data;
	/* KVEventBatch: ts, events, data_parallel_rank (omitted when None) */
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 2 || o->via.array.size > 3) {
		*why = "the batch is not an array of 2 or 3 fields";
		goto out;
	}
	if (o->via.array.ptr[0].type != MSGPACK_OBJECT_FLOAT64) {
		*why = "ts is not a float";
		goto out;
	}
	b->ts = o->via.array.ptr[0].via.f64;
	ev = &o->via.array.ptr[1];
	if (ev->type != MSGPACK_OBJECT_ARRAY) {
		*why = "events is not an array";
		goto out;
	}
	if (o->via.array.size == 3) {
		const msgpack_object *r = &o->via.array.ptr[2];

		if (r->type == MSGPACK_OBJECT_POSITIVE_INTEGER || r->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
			b->has_rank = true;
			b->rank = r->via.i64;
		} else if (r->type != MSGPACK_OBJECT_NIL) {
			*why = "data_parallel_rank is not an int or None";
			goto out;
		}
	}
	b->n = ev->via.array.size;
	b->ev = calloc(b->n ? b->n : 1, sizeof(*b->ev));
	if (!b->ev) {
		*why = "out of memory";
		goto out;
	}
	for (i = 0; i < b->n; i++)
		if (kve_event(&ev->via.array.ptr[i], &b->ev[i], why))
			goto out;
	rc = 0;
out:
	msgpack_unpacked_destroy(&u);
	if (rc)
		kve_free(b);
	return rc;
}

#undef KVE_FAIL

/*
 * A namespace row of the tests' tiny geometry (16-token blocks, 1 layer,
 * 2 kv heads of 32, 2-byte dtype) for `model`, as a HELLO makes it; with
 * pp_rank > 0 it is that pipeline stage of 2 (tensor-parallel ranks share
 * the unsharded namespace). `used` is set. Returns 0 or -EINVAL.
 */
static inline int kve_test_ns(struct kvshm_ns *ns, const char *model, uint16_t pp_rank)
{
	struct kvproto_hello hi;
	int rc;

	memset(&hi, 0, sizeof(hi));
	hi.dtype_bytes = 2;
	hi.layers = 1;
	hi.kv_heads = 2;
	hi.head_dim = 32;
	hi.block_tokens = 16;
	hi.pos_kind = KVSHM_POS_ROPE;
	snprintf(hi.model, sizeof(hi.model), "%s", model);
	if (pp_rank) {
		hi.shard.pp_rank = pp_rank;
		hi.shard.pp_size = 2;
	}
	rc = kvproto_hello_ns(&hi, ns);
	if (!rc)
		ns->used = 1;
	return rc;
}

#endif
