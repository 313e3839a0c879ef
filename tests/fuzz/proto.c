// SPDX-License-Identifier: MIT
/*
 * proto.c - fuzz target for kvproto_decode, the one parser of socket bytes,
 * and kvproto_hello_ns, which turns a HELLO into a namespace.
 *
 * Input: two bytes that choose the connection's block_tokens (0..1025, so
 * that "no namespace yet" and "over the limit" come up too), then a stream
 * of frames, each a struct kvproto_hdr and up to `len` payload bytes (fewer
 * when the input ends first; `len` is then cut to what is there, except a
 * `len` over KVPROTO_MAX_LEN, which must be refused before anything is
 * read). Every payload sits in its own exact-size allocation, so ASan sees
 * any read past what the header declares.
 *
 * Oracle: whenever kvproto_decode returns 0, the payload is exactly the
 * size its type and counts need, recomputed here independently, counts are
 * within KVPROTO_MAX_COUNT, and every record the daemon or the client would
 * then read lies inside the payload (we read them all). Refusals are
 * -EBADMSG with a reason. kvproto_hello_ns accepts exactly the namespaces
 * proto.h describes, and its page_bytes is the product of the geometry.
 * A violated promise is __builtin_trap(), which libFuzzer reports as a crash.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/proto.h"

#include "check.h"

static volatile uint64_t sink;

/* Touch every byte of every record, as a consumer of the message would. */
static void read_records(const uint8_t *p, uint64_t off, uint64_t n, uint64_t rec)
{
	uint64_t i, j, x = 0;

	for (i = 0; i < n; i++)
		for (j = 0; j < rec; j += 4) {
			uint32_t v;

			memcpy(&v, p + off + i * rec + j, rec - j < 4 ? rec - j : 4);
			x += v;
		}
	sink += x;
}

static uint32_t count_of(const uint8_t *p)
{
	struct kvproto_count c;

	memcpy(&c, p, sizeof(c));
	return c.n;
}

/* Independent check of kvproto_hello_ns against proto.h's description. */
static void check_hello(const uint8_t *p)
{
	struct kvproto_hello hi;
	struct kvshm_ns ns;
	size_t nl;
	bool dtype_ok, want, latent;
	uint32_t tp;
	int rc;

	memcpy(&hi, p, sizeof(hi));
	nl = strnlen(hi.model, sizeof(hi.model));
	dtype_ok = hi.dtype_bytes == 1 || hi.dtype_bytes == 2 || hi.dtype_bytes == 4 ||
		   hi.dtype_bytes == 8;
	tp = hi.shard.tp_size ? hi.shard.tp_size : 1;
	latent = hi.flags & KVPROTO_HELLO_LATENT;
	want = (hi.flags & ~(KVPROTO_HELLO_ENGINE_KEYS | KVPROTO_HELLO_NO_INSERT |
			     KVPROTO_HELLO_LATENT)) == 0 && nl > 0 &&
	       nl < sizeof(hi.model) && dtype_ok && hi.max_share <= 100 &&
	       hi.salt_len <= KVPROTO_MAX_SALT &&
	       hi.layers >= 1 && hi.layers <= 4096 && hi.kv_heads >= 1 && hi.kv_heads <= 4096 &&
	       hi.head_dim >= 1 && hi.head_dim <= 65536 && hi.block_tokens >= 1 &&
	       hi.block_tokens <= KVSHM_MAX_BLOCK_TOKENS && hi.pos_kind <= KVSHM_POS_MAX &&
	       /* a rank below its size (0 meaning 1) */
	       hi.shard.tp_rank < tp &&
	       hi.shard.pp_rank < (hi.shard.pp_size ? hi.shard.pp_size : 1) &&
	       /* heads a TP size splits or replicates evenly, at most 32
		* ranks writing one page; a latent page has 1 KV head */
	       (latent ? hi.kv_heads == 1 :
		tp <= hi.kv_heads ? hi.kv_heads % tp == 0 && tp <= 32 :
				     tp % hi.kv_heads == 0 && hi.kv_heads <= 32);
	memset(&ns, 0xa5, sizeof(ns));
	rc = kvproto_hello_ns(&hi, &ns);
	CHECK(rc == 0 || rc == -EINVAL);
	CHECK((rc == 0) == want);
	if (rc)
		return;
	/* 128-bit product: the claim is that 64 bits never overflow here. */
	{
		unsigned __int128 pb = (unsigned __int128)hi.block_tokens * hi.layers *
				       (latent ? 1 : 2) * hi.kv_heads * hi.head_dim *
				       hi.dtype_bytes;

		CHECK(pb == ns.page_bytes);
	}
	CHECK(ns.used == 0);
	CHECK(ns.dtype_bytes == hi.dtype_bytes && ns.layers == hi.layers &&
	      ns.kv_heads == hi.kv_heads && ns.head_dim == hi.head_dim &&
	      ns.block_tokens == hi.block_tokens && ns.pos_kind == hi.pos_kind);
	CHECK(strnlen(ns.model, sizeof(ns.model)) == nl && !memcmp(ns.model, hi.model, nl));
	/* The kind is what the flags say (engine keys or tokens), and the
	 * same geometry of the other kind is another namespace; no-insert,
	 * the share and the salt are no part of the namespace. */
	CHECK(ns.kind == ((hi.flags & KVPROTO_HELLO_ENGINE_KEYS) ? KVSHM_NS_ENGINE :
			  KVSHM_NS_TOKENS));
	{
		struct kvproto_hello other = hi;
		struct kvshm_ns ns2;

		other.flags ^= KVPROTO_HELLO_ENGINE_KEYS;
		CHECK(kvproto_hello_ns(&other, &ns2) == 0);
		CHECK(!kvshm_key_eq(ns.id, ns2.id));
		other = hi;
		other.flags ^= KVPROTO_HELLO_NO_INSERT;
		other.max_share = 0;
		other.salt_len = 0;
		CHECK(kvproto_hello_ns(&other, &ns2) == 0);
		CHECK(kvshm_key_eq(ns.id, ns2.id));
	}
	/* The stage, validated and normalised (size at least 1); the layout
	 * what the flags say; no tensor-parallel rank or size in it: every
	 * rank of every TP size declares the unsharded namespace. */
	CHECK(ns.pp_size >= 1 && ns.pp_rank < ns.pp_size && ns.resv == 0);
	CHECK(ns.layout == (latent ? KVSHM_KV_LATENT : KVSHM_KV_SPLIT));
	{
		struct kvproto_hello one = hi;
		struct kvshm_ns ns1;
		struct kvproto_part pt;
		uint32_t r = hi.shard.tp_rank;

		one.shard.tp_rank = 0;
		one.shard.tp_size = 1;
		CHECK(kvproto_hello_ns(&one, &ns1) == 0);
		CHECK(kvshm_key_eq(ns.id, ns1.id) && ns.page_bytes == ns1.page_bytes);
		/* The rank's heads, recomputed. */
		CHECK(kvproto_part(hi.kv_heads, latent, &hi.shard, &pt, NULL) == 0);
		if (latent)
			CHECK(pt.head0 == 0 && pt.heads == 1 && pt.writers == 1 && pt.writes == (r == 0));
		else if (tp <= hi.kv_heads)
			CHECK(pt.heads * tp == hi.kv_heads && pt.head0 == r * pt.heads &&
			      pt.writers == tp && pt.slice == r && pt.writes);
		else
			CHECK(pt.heads == 1 && pt.head0 == r / (tp / hi.kv_heads) &&
			      pt.writers == hi.kv_heads && pt.writes == (r % (tp / hi.kv_heads) == 0));
		CHECK(pt.head0 + pt.heads <= hi.kv_heads && pt.writers <= KVSHM_MAX_WRITERS);
	}
	for (size_t i = nl; i < sizeof(ns.model); i++)
		CHECK(ns.model[i] == 0);
}

/* What decode promised, recomputed; p has exactly len bytes. */
static void check_accepted(const struct kvproto_hdr *h, const uint8_t *p, uint32_t bt)
{
	uint32_t len = h->len, n;

	CHECK(len <= KVPROTO_MAX_LEN);
	CHECK(len == 0 || p);
	switch (h->type) {
	case KVPROTO_HELLO:
		CHECK(len == sizeof(struct kvproto_hello));
		check_hello(p);
		break;
	case KVPROTO_HELLO_R:
		CHECK(len == sizeof(struct kvproto_hello_r));
		read_records(p, 0, 1, len);
		break;
	case KVPROTO_ALLOC: {
		struct kvproto_alloc a;

		CHECK(len == sizeof(a));
		memcpy(&a, p, sizeof(a));
		CHECK(a.n >= 1 && a.n <= KVPROTO_MAX_COUNT && a.flags == 0);
		break;
	}
	case KVPROTO_ALLOC_KEYS: {
		struct kvproto_alloc a;

		CHECK(len >= sizeof(a));
		memcpy(&a, p, sizeof(a));
		CHECK(a.n >= 1 && a.n <= KVPROTO_MAX_COUNT && !(a.flags & ~KVPROTO_ALLOC_SINGLE));
		CHECK(len == 8 + (uint64_t)a.n * 32);
		read_records(p, sizeof(a), a.n, sizeof(struct kvproto_claim));
		break;
	}
	case KVPROTO_ALLOC_R:
	case KVPROTO_FREE:
		CHECK(len >= sizeof(struct kvproto_count));
		n = count_of(p);
		if (h->type == KVPROTO_ALLOC_R && n == 0) {
			CHECK(len == sizeof(struct kvproto_count));
			break;
		}
		CHECK(n >= 1 && n <= KVPROTO_MAX_COUNT);
		CHECK(len == sizeof(struct kvproto_count) + (uint64_t)n * sizeof(struct kvproto_pg));
		read_records(p, sizeof(struct kvproto_count), n, sizeof(struct kvproto_pg));
		break;
	case KVPROTO_PUBLISH:
		CHECK(bt >= 1 && bt <= KVSHM_MAX_BLOCK_TOKENS);
		CHECK(len >= sizeof(struct kvproto_count));
		n = count_of(p);
		CHECK(n >= 1 && n <= KVPROTO_MAX_COUNT);
		/* page, gen, key, parent, extra digest: 4 + 4 + 3 x 16 bytes */
		CHECK(len == 8 + (uint64_t)n * (56 + 4 * (uint64_t)bt));
		CHECK(len == kvproto_pub_bytes(n, bt));
		read_records(p, sizeof(struct kvproto_count), n,
			     sizeof(struct kvproto_pub) + 4 * (uint64_t)bt);
		break;
	case KVPROTO_PUBLISH_R:
		CHECK(len >= sizeof(struct kvproto_count));
		n = count_of(p);
		CHECK(n >= 1 && n <= KVPROTO_MAX_COUNT);
		CHECK(len == 8 + (uint64_t)n * sizeof(struct kvproto_pub_r));
		read_records(p, sizeof(struct kvproto_count), n, sizeof(struct kvproto_pub_r));
		break;
	case KVPROTO_FREE_R:
		CHECK(len == sizeof(struct kvproto_count));
		break;
	case KVPROTO_FETCH: {
		struct kvproto_fetch fh;

		CHECK(bt >= 1 && bt <= KVSHM_MAX_BLOCK_TOKENS);
		CHECK(len >= sizeof(fh));
		memcpy(&fh, p, sizeof(fh));
		CHECK(fh.n >= 1 && fh.n <= KVPROTO_MAX_COUNT && fh.flags == 0);
		CHECK(len == 24 + (uint64_t)fh.n * (16 + 4 * (uint64_t)bt));
		CHECK(len == kvproto_fetch_bytes(fh.n, bt));
		read_records(p, sizeof(fh), fh.n, 16 + 4 * (uint64_t)bt);
		break;
	}
	case KVPROTO_RESTORE:
	case KVPROTO_RESTORE_R:
	case KVPROTO_FETCH_R: {
		uint64_t rec = h->type == KVPROTO_RESTORE ? sizeof(struct kvshm_key) : 4;

		CHECK(len >= sizeof(struct kvproto_count));
		n = count_of(p);
		CHECK(n >= 1 && n <= KVPROTO_MAX_COUNT);
		CHECK(len == 8 + (uint64_t)n * rec);
		read_records(p, sizeof(struct kvproto_count), n, rec);
		break;
	}
	case KVPROTO_STAT: {
		struct kvproto_stat st;

		CHECK(len == sizeof(st));
		memcpy(&st, p, sizeof(st));
		CHECK(st.flags == 0);
		break;
	}
	case KVPROTO_STAT_R:
		CHECK(len == sizeof(struct kvproto_stat_r));
		break;
	case KVPROTO_BYE:
		CHECK(len == 0);
		break;
	case KVPROTO_ERROR:
		CHECK(len >= sizeof(struct kvproto_error));
		read_records(p, 0, 1, len);	/* header and message text */
		break;
	case KVPROTO_POOL: {
		struct kvproto_pool q;

		CHECK(len == sizeof(q));
		memcpy(&q, p, sizeof(q));
		CHECK(q.flags == 0);
		break;
	}
	case KVPROTO_POOL_R: {
		struct kvproto_pool_r q;

		CHECK(len == sizeof(q));
		memcpy(&q, p, sizeof(q));
		CHECK(q.n_chunks >= 1 && q.n_chunks <= KVPROTO_MAX_CHUNKS);
		CHECK(q.granularity && q.chunk_bytes && q.chunk_bytes % q.granularity == 0);
		CHECK(q.pool_bytes && q.chunk_bytes <= UINT64_MAX / q.n_chunks &&
		      q.pool_bytes <= q.chunk_bytes * q.n_chunks);
		break;
	}
	case KVPROTO_DROP:
	case KVPROTO_RESET: {
		struct kvproto_drop q;

		CHECK(len == sizeof(q) && sizeof(q) == sizeof(struct kvproto_reset));
		memcpy(&q, p, sizeof(q));
		CHECK(q.flags == 0);
		break;
	}
	case KVPROTO_DROP_R:
		CHECK(len == sizeof(struct kvproto_drop_r));
		read_records(p, 0, 1, len);
		break;
	case KVPROTO_RESET_R:
		CHECK(len == sizeof(struct kvproto_reset_r));
		break;
	case KVPROTO_ADMIN: {
		struct kvproto_admin q;

		/* version, op, ns_row, ttl, pin id, n_tokens; model 64, tenant
		 * 32, label 24 bytes, each NUL-terminated; then the tokens */
		CHECK(len >= 144 && sizeof(q) == 144);
		memcpy(&q, p, sizeof(q));
		CHECK(q.op >= 1 && q.op <= 4);
		CHECK(memchr(q.model, 0, 64) && memchr(q.tenant, 0, 32) && memchr(q.label, 0, 24));
		CHECK(len == 144 + 4 * (uint64_t)q.n_tokens);
		CHECK(q.op == KVPROTO_ADMIN_PIN ? q.n_tokens && q.ttl_s >= 1 &&
						  q.ttl_s <= 30u * 86400 : !q.n_tokens);
		read_records(p, 0, 1, len);
		break;
	}
	case KVPROTO_ADMIN_R:
		CHECK(len == 32);
		break;
	case KVPROTO_PIN: {
		struct kvproto_pin q;

		CHECK(len >= 40 && sizeof(q) == 40);
		memcpy(&q, p, sizeof(q));
		CHECK(q.n >= 1 && q.n <= 16384 && q.ttl_s >= 1 && q.ttl_s <= 30u * 86400);
		CHECK(!(q.flags & ~1u) && !q.pad && memchr(q.label, 0, 24));
		CHECK(len == 40 + 16 * (uint64_t)q.n);
		read_records(p, sizeof(q), q.n, 16);
		break;
	}
	case KVPROTO_PIN_R:
		CHECK(len == sizeof(struct kvproto_pin_r));
		break;
	case KVPROTO_UNPIN: {
		struct kvproto_unpin q;

		CHECK(len == sizeof(q));
		memcpy(&q, p, sizeof(q));
		CHECK(q.flags == 0);
		break;
	}
	case KVPROTO_UNPIN_R:
		CHECK(len == sizeof(struct kvproto_unpin));
		break;
	default:
		CHECK(0);	/* an unknown type was accepted */
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t bt;
	size_t off = 2;
	int frames = 0;

	if (size < 2)
		return 0;
	bt = (uint32_t)(data[0] | data[1] << 8) % (KVSHM_MAX_BLOCK_TOKENS + 2);
	while (size - off >= sizeof(struct kvproto_hdr) && frames++ < 64) {
		struct kvproto_hdr h;
		const char *why = NULL;
		uint8_t *p;
		size_t have;
		int rc;

		memcpy(&h, data + off, sizeof(h));
		off += sizeof(h);
		have = size - off;
		if (h.len > KVPROTO_MAX_LEN) {
			/* Must be refused on the header alone: give it nothing. */
			p = malloc(1);
			CHECK(p);
			rc = kvproto_decode(&h, p, bt, &why);
			free(p);
			CHECK(rc == -EBADMSG && why && *why);
			break;
		}
		if (h.len > have)
			h.len = (uint32_t)have;
		p = h.len ? malloc(h.len) : NULL;
		CHECK(!h.len || p);
		if (h.len)
			memcpy(p, data + off, h.len);
		off += h.len;
		/* The server passes NULL for an empty payload; why may be NULL. */
		rc = kvproto_decode(&h, p, bt, (frames & 1) ? &why : NULL);
		CHECK(rc == 0 || rc == -EBADMSG);
		if (rc == 0)
			check_accepted(&h, p, bt);
		else if (frames & 1)
			CHECK(why && *why);
		CHECK(rc != 0 || h.magic == KVPROTO_MAGIC);
		/* A HELLO body is checked whatever its frame said. */
		if (h.len >= sizeof(struct kvproto_hello) && (rc || h.type != KVPROTO_HELLO))
			check_hello(p);
		free(p);
	}
	return 0;
}
