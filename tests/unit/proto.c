// SPDX-License-Identifier: MIT
/*
 * proto.c - unit tests for shm/proto.c: message validation and the
 * default socket path.
 *
 * kvproto_decode is the one parser of socket bytes: well-formed messages
 * of every type pass; a bad magic, oversize length, unknown type, wrong
 * fixed size, zero or excessive record count, a count that disagrees with
 * the length (either way), a PUBLISH with no block size and an ALLOC with
 * flags are refused with -EBADMSG and a reason. kvproto_socket_path honours
 * $KVCACHED_SOCKET and refuses paths that do not fit.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/wait.h>

#include <sys/stat.h>

#include <fcntl.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../shm/proto.h"

/* A payload big enough for the largest message these tests build. */
#define BUF_BYTES (sizeof(struct kvproto_count) + \
		   (size_t)(KVPROTO_MAX_COUNT + 1) * sizeof(struct kvproto_pg))

static uint8_t *buf;

static int group_setup(void **state)
{
	(void)state;
	buf = calloc(1, BUF_BYTES);
	return buf ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	free(buf);
	return 0;
}

static struct kvproto_hdr hdr(uint16_t type, uint32_t len)
{
	struct kvproto_hdr h = {
		.magic = KVPROTO_MAGIC,
		.type = type,
		.len = len,
		.seq = 17,
	};

	return h;
}

/* Payload: a record count followed by records; returns the payload length. */
static uint32_t counted(uint32_t n, uint64_t rec, uint32_t records)
{
	struct kvproto_count c = { n, 0 };
	uint64_t len = sizeof(c) + (uint64_t)records * rec;

	assert_true(len <= BUF_BYTES);
	memset(buf, 0, len);
	memcpy(buf, &c, sizeof(c));
	return (uint32_t)len;
}

static void ok(uint16_t type, uint32_t len, uint32_t bt)
{
	struct kvproto_hdr h = hdr(type, len);
	const char *why = NULL;

	assert_int_equal(kvproto_decode(&h, len ? buf : NULL, bt, &why), 0);
}

static void bad_hdr(const struct kvproto_hdr *h, const void *p, uint32_t bt)
{
	const char *why = NULL;

	assert_int_equal(kvproto_decode(h, p, bt, &why), -EBADMSG);
	assert_non_null(why);
	assert_true(strlen(why) > 0);
	/* why is optional. */
	assert_int_equal(kvproto_decode(h, p, bt, NULL), -EBADMSG);
}

static void bad(uint16_t type, uint32_t len, uint32_t bt)
{
	struct kvproto_hdr h = hdr(type, len);

	bad_hdr(&h, buf, bt);
}

static void test_hello(void **state)
{
	struct kvproto_hello hello = { .version = KVPROTO_VERSION, .block_tokens = 16 };
	struct kvproto_hello_r hr = { .version = KVPROTO_VERSION };

	(void)state;
	memcpy(buf, &hello, sizeof(hello));
	ok(KVPROTO_HELLO, sizeof(hello), 0);	/* no namespace yet: bt 0 */
	ok(KVPROTO_HELLO, sizeof(hello), 16);
	bad(KVPROTO_HELLO, sizeof(hello) - 1, 0);
	bad(KVPROTO_HELLO, sizeof(hello) + 1, 0);
	bad(KVPROTO_HELLO, 0, 0);
	memcpy(buf, &hr, sizeof(hr));
	ok(KVPROTO_HELLO_R, sizeof(hr), 0);
	bad(KVPROTO_HELLO_R, sizeof(hr) - 8, 0);
	bad(KVPROTO_HELLO_R, sizeof(hr) + 8, 0);
	bad(KVPROTO_HELLO_R, 0, 0);
}

static void put_alloc(uint32_t n, uint32_t flags)
{
	struct kvproto_alloc a = { n, flags };

	memcpy(buf, &a, sizeof(a));
}

static void test_alloc(void **state)
{
	(void)state;
	put_alloc(1, 0);
	ok(KVPROTO_ALLOC, sizeof(struct kvproto_alloc), 16);
	put_alloc(KVPROTO_MAX_COUNT, 0);
	ok(KVPROTO_ALLOC, sizeof(struct kvproto_alloc), 16);
	put_alloc(0, 0);
	bad(KVPROTO_ALLOC, sizeof(struct kvproto_alloc), 16);
	put_alloc(KVPROTO_MAX_COUNT + 1, 0);
	bad(KVPROTO_ALLOC, sizeof(struct kvproto_alloc), 16);
	put_alloc(UINT32_MAX, 0);
	bad(KVPROTO_ALLOC, sizeof(struct kvproto_alloc), 16);
	/* No flags are defined. */
	put_alloc(4, 1);
	bad(KVPROTO_ALLOC, sizeof(struct kvproto_alloc), 16);
	put_alloc(4, 0x80000000u);
	bad(KVPROTO_ALLOC, sizeof(struct kvproto_alloc), 16);
	/* Wrong sizes. */
	put_alloc(4, 0);
	bad(KVPROTO_ALLOC, sizeof(struct kvproto_alloc) - 4, 16);
	bad(KVPROTO_ALLOC, sizeof(struct kvproto_alloc) + 4, 16);
	bad(KVPROTO_ALLOC, 0, 16);
}

/* ALLOC_KEYS: the ALLOC header, then one claim (key, parent) per page;
 * only KVPROTO_ALLOC_SINGLE is a known flag. Lengths are checked without
 * reading past the header, so the largest count needs no large buffer. */
static void test_alloc_keys(void **state)
{
	const uint32_t hd = sizeof(struct kvproto_alloc), rec = sizeof(struct kvproto_claim);

	(void)state;
	put_alloc(1, 0);
	ok(KVPROTO_ALLOC_KEYS, hd + rec, 16);
	put_alloc(3, KVPROTO_ALLOC_SINGLE);
	ok(KVPROTO_ALLOC_KEYS, hd + 3 * rec, 16);
	ok(KVPROTO_ALLOC_KEYS, hd + 3 * rec, 0);	/* needs no block size */
	put_alloc(KVPROTO_MAX_COUNT, 0);
	ok(KVPROTO_ALLOC_KEYS, hd + KVPROTO_MAX_COUNT * rec, 16);
	put_alloc(KVPROTO_MAX_COUNT + 1, 0);
	bad(KVPROTO_ALLOC_KEYS, hd + (KVPROTO_MAX_COUNT + 1) * rec, 16);
	put_alloc(0, 0);
	bad(KVPROTO_ALLOC_KEYS, hd, 16);
	/* A count whose claims would overflow 32 bits of length. */
	put_alloc(UINT32_MAX, 0);
	bad(KVPROTO_ALLOC_KEYS, hd + rec, 16);
	put_alloc(3, 2);
	bad(KVPROTO_ALLOC_KEYS, hd + 3 * rec, 16);
	put_alloc(3, 0x80000001u);
	bad(KVPROTO_ALLOC_KEYS, hd + 3 * rec, 16);
	put_alloc(3, 0);
	bad(KVPROTO_ALLOC_KEYS, hd + 2 * rec, 16);
	bad(KVPROTO_ALLOC_KEYS, hd + 4 * rec, 16);
	bad(KVPROTO_ALLOC_KEYS, hd + 3 * rec - 1, 16);
	bad(KVPROTO_ALLOC_KEYS, hd - 4, 16);
	bad(KVPROTO_ALLOC_KEYS, 0, 16);
	/* Plain ALLOC keeps refusing the flag. */
	put_alloc(3, KVPROTO_ALLOC_SINGLE);
	bad(KVPROTO_ALLOC, hd, 16);
}

/* FREE and ALLOC_R: a count and n pages. */
static void test_pages(void **state)
{
	static const uint16_t types[] = { KVPROTO_FREE, KVPROTO_ALLOC_R };
	const uint64_t rec = sizeof(struct kvproto_pg);
	size_t t;

	(void)state;
	for (t = 0; t < 2; t++) {
		uint16_t ty = types[t];

		ok(ty, counted(1, rec, 1), 0);
		ok(ty, counted(3, rec, 3), 16);
		ok(ty, counted(KVPROTO_MAX_COUNT, rec, KVPROTO_MAX_COUNT), 16);
		/* Count and length disagree, both ways. */
		bad(ty, counted(3, rec, 2), 16);
		bad(ty, counted(2, rec, 3), 16);
		bad(ty, counted(1, rec, 1) - 1, 16);
		bad(ty, counted(1, rec, 1) + 1, 16);
		/* Over the limit, even with the length to match. */
		bad(ty, counted(KVPROTO_MAX_COUNT + 1, rec, KVPROTO_MAX_COUNT + 1), 16);
		bad(ty, counted(UINT32_MAX, rec, 1), 16);
		/* Shorter than its count. */
		bad(ty, 4, 16);
	}
	/* FREE of no pages is malformed; ALLOC_R may grant none. */
	bad(KVPROTO_FREE, counted(0, rec, 0), 16);
	bad(KVPROTO_FREE, 0, 16);
	ok(KVPROTO_ALLOC_R, counted(0, rec, 0), 16);
	bad(KVPROTO_ALLOC_R, counted(0, rec, 1), 16);
	bad(KVPROTO_ALLOC_R, 0, 16);
}

/*
 * Regression: a reply of just a kvproto_count used to be accepted whatever
 * count it declared ({n = 5} with no records), although proto.h promises
 * "payload exactly the size its counts imply". The short form is valid
 * only for n == 0 (zero pages granted).
 */
static void test_alloc_r_short_form_only_for_zero(void **state)
{
	(void)state;
	ok(KVPROTO_ALLOC_R, counted(0, sizeof(struct kvproto_pg), 0), 16);
	bad(KVPROTO_ALLOC_R, counted(5, sizeof(struct kvproto_pg), 0), 16);
	bad(KVPROTO_ALLOC_R, counted(KVPROTO_MAX_COUNT, sizeof(struct kvproto_pg), 0), 16);
}

static void test_publish(void **state)
{
	(void)state;
	/* Each record: struct kvproto_pub (page, gen, key, parent, extra
	 * digest: 56 bytes) then bt tokens. */
	assert_int_equal(kvproto_pub_bytes(1, 16), 8 + 56 + 64);
	assert_int_equal(kvproto_pub_bytes(3, 1), 8 + 3 * 60);

	ok(KVPROTO_PUBLISH, counted(1, kvproto_pub_bytes(1, 16) - 8, 1), 16);
	ok(KVPROTO_PUBLISH, counted(5, kvproto_pub_bytes(1, 16) - 8, 5), 16);
	ok(KVPROTO_PUBLISH, counted(2, kvproto_pub_bytes(1, 1), 0) + 2 * 60, 1);
	ok(KVPROTO_PUBLISH, counted(3, kvproto_pub_bytes(1, KVSHM_MAX_BLOCK_TOKENS) - 8, 3),
	   KVSHM_MAX_BLOCK_TOKENS);
	/* No namespace declared (bt 0), or an impossible bt. */
	counted(1, kvproto_pub_bytes(1, 16) - 8, 1);
	bad(KVPROTO_PUBLISH, 8, 0);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(1, 16), 0);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(1, 0), 0);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(1, KVSHM_MAX_BLOCK_TOKENS + 1),
	    KVSHM_MAX_BLOCK_TOKENS + 1);
	/* Records sized for another block size. */
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(1, 16), 8);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(1, 16), 32);
	/* Count and length disagree, both ways. */
	counted(2, 0, 0);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(1, 16), 16);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(3, 16), 16);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(2, 16) - 4, 16);
	/* Zero records, or too many. */
	counted(0, 0, 0);
	bad(KVPROTO_PUBLISH, 8, 16);
	counted(KVPROTO_MAX_COUNT + 1, 0, 0);
	bad(KVPROTO_PUBLISH, (uint32_t)kvproto_pub_bytes(1, 16), 16);
	bad(KVPROTO_PUBLISH, 4, 16);
}

static void test_replies(void **state)
{
	const uint64_t rec = sizeof(struct kvproto_pub_r);
	struct kvproto_error e = { -ENOSPC, 0 };

	(void)state;
	ok(KVPROTO_PUBLISH_R, counted(1, rec, 1), 0);
	ok(KVPROTO_PUBLISH_R, counted(7, rec, 7), 16);
	bad(KVPROTO_PUBLISH_R, counted(7, rec, 6), 16);
	bad(KVPROTO_PUBLISH_R, counted(6, rec, 7), 16);
	bad(KVPROTO_PUBLISH_R, counted(0, rec, 0), 16);
	bad(KVPROTO_PUBLISH_R, 0, 16);

	ok(KVPROTO_FREE_R, counted(0, 0, 0), 16);
	ok(KVPROTO_FREE_R, counted(5, 0, 0), 16);
	bad(KVPROTO_FREE_R, counted(1, 8, 1), 16);
	bad(KVPROTO_FREE_R, 4, 16);
	bad(KVPROTO_FREE_R, 0, 16);

	memcpy(buf, &e, sizeof(e));
	ok(KVPROTO_ERROR, sizeof(e), 0);
	memcpy(buf + sizeof(e), "pool is full", 12);
	ok(KVPROTO_ERROR, sizeof(e) + 12, 0);
	bad(KVPROTO_ERROR, sizeof(e) - 1, 0);
	bad(KVPROTO_ERROR, 0, 0);
}

static void test_header(void **state)
{
	struct kvproto_hdr h;

	(void)state;
	put_alloc(1, 0);
	h = hdr(KVPROTO_ALLOC, sizeof(struct kvproto_alloc));
	assert_int_equal(kvproto_decode(&h, buf, 16, NULL), 0);
	/* Bad magic, whatever else is right. */
	h.magic = KVPROTO_MAGIC ^ 0x100;
	bad_hdr(&h, buf, 16);
	h.magic = 0;
	bad_hdr(&h, buf, 16);
	h.magic = __builtin_bswap32(KVPROTO_MAGIC);	/* other endianness */
	bad_hdr(&h, buf, 16);
	/* Unknown types. */
	h = hdr(0, sizeof(struct kvproto_alloc));
	bad_hdr(&h, buf, 16);
	h.type = KVPROTO_STAT_R + 1;
	bad_hdr(&h, buf, 16);
	h.type = 0xffff;
	bad_hdr(&h, buf, 16);
	/* A length over the limit is refused before anything else. */
	h = hdr(KVPROTO_FREE, KVPROTO_MAX_LEN + 1);
	bad_hdr(&h, buf, 16);
	h.len = UINT32_MAX;
	bad_hdr(&h, buf, 16);
	h.type = KVPROTO_ERROR;
	bad_hdr(&h, buf, 16);
	/* A length with no payload. */
	h = hdr(KVPROTO_ALLOC, sizeof(struct kvproto_alloc));
	bad_hdr(&h, NULL, 16);
	h = hdr(KVPROTO_ERROR, 64);
	bad_hdr(&h, NULL, 16);
}

/*
 * The frame table (KVPROTO_FRAMES): rows in numeric order, and every
 * number between them an unknown type to decode, whatever its payload.
 */
#define TYPE_ROW(name, type, ...) type,
static const unsigned frame_types[] = { KVPROTO_FRAMES(TYPE_ROW) };

static void test_frame_table(void **state)
{
	struct kvproto_hdr h;
	const char *why;
	size_t i;
	unsigned t;

	(void)state;
	put_alloc(1, 0);	/* a payload that is a count of 1 */
	for (i = 1; i < sizeof(frame_types) / sizeof(frame_types[0]); i++)
		assert_true(frame_types[i - 1] < frame_types[i]);
	assert_int_equal(frame_types[i - 1], KVPROTO_TYPE_MAX);
	for (i = 0, t = 0; t <= KVPROTO_TYPE_MAX + 1; t++) {
		if (i < sizeof(frame_types) / sizeof(frame_types[0]) && t == frame_types[i]) {
			i++;
			continue;
		}
		h = hdr((uint16_t)t, 0);
		why = NULL;
		assert_int_equal(kvproto_decode(&h, NULL, 16, &why), -EBADMSG);
		assert_string_equal(why, "unknown message type");
		h = hdr((uint16_t)t, sizeof(struct kvproto_count));
		assert_int_equal(kvproto_decode(&h, buf, 16, NULL), -EBADMSG);
	}
}

static char *saved_sock, *saved_xdg;

static int env_setup(void **state)
{
	const char *s = getenv("KVCACHED_SOCKET"), *x = getenv("XDG_RUNTIME_DIR");

	(void)state;
	saved_sock = s ? strdup(s) : NULL;
	saved_xdg = x ? strdup(x) : NULL;
	return 0;
}

static int env_teardown(void **state)
{
	(void)state;
	if (saved_sock)
		setenv("KVCACHED_SOCKET", saved_sock, 1);
	else
		unsetenv("KVCACHED_SOCKET");
	if (saved_xdg)
		setenv("XDG_RUNTIME_DIR", saved_xdg, 1);
	else
		unsetenv("XDG_RUNTIME_DIR");
	free(saved_sock);
	free(saved_xdg);
	saved_sock = saved_xdg = NULL;
	return 0;
}

static void test_socket_path(void **state)
{
	char p[108], want[128], longp[300];

	(void)state;
	/* $KVCACHED_SOCKET wins over everything. */
	setenv("KVCACHED_SOCKET", "/tmp/kvt-proto/test.sock", 1);
	setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
	assert_int_equal(kvproto_socket_path(p, sizeof(p)), 0);
	assert_string_equal(p, "/tmp/kvt-proto/test.sock");

	/* Too long for the buffer: refused, never silently cut. */
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = 0;
	setenv("KVCACHED_SOCKET", longp, 1);
	assert_int_equal(kvproto_socket_path(p, sizeof(p)), -ENAMETOOLONG);
	setenv("KVCACHED_SOCKET", "/tmp/kvt-proto/test.sock", 1);
	assert_int_equal(kvproto_socket_path(p, strlen("/tmp/kvt-proto/test.sock")),
			 -ENAMETOOLONG);
	assert_int_equal(kvproto_socket_path(p, strlen("/tmp/kvt-proto/test.sock") + 1), 0);
	assert_string_equal(p, "/tmp/kvt-proto/test.sock");

	/* Empty or unset: the per-user default. */
	setenv("KVCACHED_SOCKET", "", 1);
	assert_int_equal(kvproto_socket_path(p, sizeof(p)), 0);
	if (geteuid() == 0)
		assert_string_equal(p, "/run/kvcached/kvcached.sock");
	else
		assert_string_equal(p, "/run/user/4242/kvcached.sock");
	unsetenv("KVCACHED_SOCKET");
	unsetenv("XDG_RUNTIME_DIR");
	assert_int_equal(kvproto_socket_path(p, sizeof(p)), 0);
	if (geteuid() == 0)
		snprintf(want, sizeof(want), "/run/kvcached/kvcached.sock");
	else
		snprintf(want, sizeof(want), "/tmp/kvcached-%u/kvcached.sock",
			 (unsigned)geteuid());
	assert_string_equal(p, want);
	if (geteuid() != 0) {
		setenv("XDG_RUNTIME_DIR", longp, 1);
		assert_int_equal(kvproto_socket_path(p, sizeof(p)), -ENAMETOOLONG);
	}
}

/* kvproto_hello_ns: the one geometry check both ends use. */
static void test_hello_ns(void **state)
{
	struct kvproto_hello good = { .version = KVPROTO_VERSION, .dtype_bytes = 2,
				      .layers = 32, .kv_heads = 8, .head_dim = 128,
				      .block_tokens = 16, .pos_kind = 1, .model = "llama-3-8b" };
	struct kvproto_hello h;
	struct kvshm_ns ns, ns2, ns3;

	(void)state;
	assert_int_equal(kvproto_hello_ns(&good, &ns), 0);
	assert_int_equal(ns.page_bytes, 2u << 20);	/* Llama-3-8B, bf16, 16 tokens */
	assert_string_equal(ns.model, "llama-3-8b");
	assert_int_equal(ns.used, 0);
	h = good;
	h.max_pins = 77;	/* not part of the identity */
	memcpy(h.name, "other", 6);
	h.flags = KVPROTO_HELLO_NO_INSERT;	/* nor are these: the salt keys */
	h.max_share = 100;			/* a space within the namespace */
	h.salt_len = KVPROTO_MAX_SALT;
	assert_int_equal(kvproto_hello_ns(&h, &ns2), 0);
	assert_memory_equal(&ns.id, &ns2.id, sizeof(ns.id));
	h = good;
	h.layers = 16;
	assert_int_equal(kvproto_hello_ns(&h, &ns2), 0);
	assert_memory_not_equal(&ns.id, &ns2.id, sizeof(ns.id));
	/* The largest geometry allowed does not overflow. */
	h = good;
	h.dtype_bytes = 8;
	h.layers = 4096;
	h.kv_heads = 4096;
	h.head_dim = 65536;
	h.block_tokens = KVSHM_MAX_BLOCK_TOKENS;
	assert_int_equal(kvproto_hello_ns(&h, &ns2), 0);
	assert_int_equal(ns2.page_bytes, 1024ull * 4096 * 2 * 4096 * 65536 * 8);
#define BAD_HELLO(field, value) do { \
		h = good; h.field = value; \
		assert_int_equal(kvproto_hello_ns(&h, &ns2), -EINVAL); \
	} while (0)
	BAD_HELLO(flags, 4);
	BAD_HELLO(flags, KVPROTO_HELLO_ENGINE_KEYS | 4);
	BAD_HELLO(max_share, 101);
	BAD_HELLO(salt_len, KVPROTO_MAX_SALT + 1);
	BAD_HELLO(flags, KVPROTO_HELLO_LATENT);	/* a latent page has 1 KV head, not 8 */
	BAD_HELLO(shard.tp_size, 3);	/* 8 heads do not split in 3 */
	BAD_HELLO(shard.tp_size, 12);	/* nor replicate over 12 */
	BAD_HELLO(shard.tp_rank, 1);	/* rank 1 of 1 */
	BAD_HELLO(dtype_bytes, 3);
	BAD_HELLO(dtype_bytes, 0);
	BAD_HELLO(layers, 0);
	BAD_HELLO(layers, 4097);
	BAD_HELLO(kv_heads, 0);
	BAD_HELLO(kv_heads, 4097);
	BAD_HELLO(head_dim, 0);
	BAD_HELLO(head_dim, 65537);
	BAD_HELLO(block_tokens, 0);
	BAD_HELLO(block_tokens, KVSHM_MAX_BLOCK_TOKENS + 1);
	BAD_HELLO(pos_kind, KVSHM_POS_MAX + 1);
	BAD_HELLO(model[0], 0);
	h = good;
	memset(h.model, 'm', sizeof(h.model));	/* unterminated */
	assert_int_equal(kvproto_hello_ns(&h, &ns2), -EINVAL);
	/* Engine keys: another kind, another namespace of the same model
	 * (sharded or not), and the kind survives kvproto_ns_declared. */
	h = good;
	h.flags = KVPROTO_HELLO_ENGINE_KEYS;
	assert_int_equal(kvproto_hello_ns(&h, &ns2), 0);
	assert_int_equal(ns2.kind, KVSHM_NS_ENGINE);
	assert_int_equal(ns.kind, KVSHM_NS_TOKENS);
	assert_memory_not_equal(&ns.id, &ns2.id, sizeof(ns.id));
	{
		struct kvshm_ns back;

		assert_int_equal(kvproto_ns_declared(&ns2, &back), 0);
		assert_int_equal(back.kind, KVSHM_NS_ENGINE);
		assert_memory_equal(&back.id, &ns2.id, sizeof(ns2.id));
		assert_int_equal(kvproto_ns_declared(&ns, &back), 0);
		assert_memory_equal(&back.id, &ns.id, sizeof(ns.id));
		ns2.kind = 7;	/* read from outside: no HELLO declares it */
		assert_int_equal(kvproto_ns_declared(&ns2, &back), -EINVAL);
	}
	h.shard.tp_size = 2;
	assert_int_equal(kvproto_hello_ns(&h, &ns2), 0);
	h.flags = 0;
	assert_int_equal(kvproto_hello_ns(&h, &ns3), 0);
	assert_memory_not_equal(&ns3.id, &ns2.id, sizeof(ns2.id));
	/* Every tensor-parallel size and rank of a model is one namespace:
	 * the unsharded one (issue #33). */
	assert_memory_equal(&ns3.id, &ns.id, sizeof(ns.id));
	h.shard.tp_rank = 1;
	h.shard.tp_size = 8;
	assert_int_equal(kvproto_hello_ns(&h, &ns3), 0);
	assert_memory_equal(&ns3.id, &ns.id, sizeof(ns.id));
	assert_int_equal(ns3.page_bytes, ns.page_bytes);	/* every head */
	h.shard.tp_size = 32;	/* 8 heads replicated 4 times */
	assert_int_equal(kvproto_hello_ns(&h, &ns3), 0);
	assert_memory_equal(&ns3.id, &ns.id, sizeof(ns.id));
	/* A pipeline stage holds other layers: a namespace of its own. */
	h = good;
	h.shard.pp_size = 2;
	assert_int_equal(kvproto_hello_ns(&h, &ns2), 0);
	assert_memory_not_equal(&ns2.id, &ns.id, sizeof(ns.id));
	assert_int_equal(ns2.pp_size, 2);
	h.shard.pp_rank = 1;
	assert_int_equal(kvproto_hello_ns(&h, &ns3), 0);
	assert_memory_not_equal(&ns2.id, &ns3.id, sizeof(ns.id));
	/* An MLA latent: 1 KV head, no K/V split, its own namespace. */
	h = good;
	h.flags = KVPROTO_HELLO_LATENT;
	h.kv_heads = 1;
	h.head_dim = 576;	/* kv_lora_rank 512 + rope 64 (DeepSeek-V3) */
	h.layers = 61;
	assert_int_equal(kvproto_hello_ns(&h, &ns2), 0);
	assert_int_equal(ns2.layout, KVSHM_KV_LATENT);
	assert_int_equal(ns2.page_bytes, 16ull * 61 * 576 * 2);
	h.flags = 0;
	assert_int_equal(kvproto_hello_ns(&h, &ns3), 0);
	assert_int_equal(ns3.page_bytes, 2 * ns2.page_bytes);
	assert_memory_not_equal(&ns2.id, &ns3.id, sizeof(ns.id));
	{
		struct kvshm_ns back;

		assert_int_equal(kvproto_ns_declared(&ns2, &back), 0);
		assert_int_equal(back.layout, KVSHM_KV_LATENT);
		assert_memory_equal(&back.id, &ns2.id, sizeof(ns2.id));
		ns2.layout = 2;	/* no such layout */
		assert_int_equal(kvproto_ns_declared(&ns2, &back), -EINVAL);
	}
}

/* kvproto_part: which heads a tensor-parallel rank holds and writes. */
static void test_part(void **state)
{
	struct kvshm_shard sh = { 0 };
	struct kvproto_part p;
	const char *why = NULL;
	uint32_t r;

	(void)state;
	assert_int_equal(kvproto_part(8, false, &sh, &p, &why), 0);	/* not sharded */
	assert_true(p.head0 == 0 && p.heads == 8 && p.writers == 1 && p.writes);
	sh.tp_size = 4;
	for (r = 0; r < 4; r++) {	/* 8 heads at TP 4: 2 each, 4 writers */
		sh.tp_rank = (uint16_t)r;
		assert_int_equal(kvproto_part(8, false, &sh, &p, &why), 0);
		assert_true(p.head0 == 2 * r && p.heads == 2 && p.slice == r && p.writers == 4 &&
			    p.writes);
	}
	sh.tp_size = 8;
	for (r = 0; r < 8; r++) {	/* 2 heads at TP 8: replicated, 2 writers */
		sh.tp_rank = (uint16_t)r;
		assert_int_equal(kvproto_part(2, false, &sh, &p, &why), 0);
		assert_true(p.head0 == r / 4 && p.heads == 1 && p.writers == 2);
		assert_int_equal(p.writes, r % 4 == 0);
		if (p.writes)
			assert_int_equal(p.slice, r / 4);
	}
	for (r = 0; r < 8; r++) {	/* MLA: rank 0 writes the latent */
		sh.tp_rank = (uint16_t)r;
		assert_int_equal(kvproto_part(1, true, &sh, &p, &why), 0);
		assert_true(p.head0 == 0 && p.heads == 1 && p.writers == 1);
		assert_int_equal(p.writes, r == 0);
	}
	assert_int_equal(kvproto_part(2, true, &sh, &p, &why), -EINVAL);
	assert_string_equal(why, "a latent (MLA) model declares 1 KV head");
	sh.tp_size = 3;
	sh.tp_rank = 0;
	assert_int_equal(kvproto_part(8, false, &sh, &p, &why), -EINVAL);
	assert_string_equal(why, "tp_size does not divide the model's KV heads");
	assert_int_equal(kvproto_part(2, false, &sh, &p, &why), -EINVAL);
	assert_string_equal(why, "the model's KV heads do not divide tp_size");
	sh.tp_rank = 3;
	assert_int_equal(kvproto_part(8, false, &sh, &p, &why), -EINVAL);
	assert_string_equal(why, "tp_rank is not below tp_size");
	sh.tp_rank = 0;
	sh.tp_size = 64;
	assert_int_equal(kvproto_part(64, false, &sh, &p, &why), -EINVAL);
	assert_string_equal(why, "more than 32 ranks would write slices of one page");
	sh.tp_size = 32;
	assert_int_equal(kvproto_part(64, false, &sh, &p, &why), 0);
	assert_int_equal(p.writers, 32);
}

/* STAT (an observer's attach) and its reply. */
static void test_stat(void **state)
{
	struct kvproto_stat st = { KVPROTO_VERSION, 0 };
	struct kvproto_hdr h = hdr(KVPROTO_STAT, sizeof(st));
	const char *why = NULL;

	(void)state;
	assert_int_equal(kvproto_decode(&h, &st, 0, &why), 0);
	st.flags = 1;
	assert_int_equal(kvproto_decode(&h, &st, 0, &why), -EBADMSG);
	assert_non_null(why);
	h.len = sizeof(st) - 1;
	assert_int_equal(kvproto_decode(&h, &st, 0, NULL), -EBADMSG);
	ok(KVPROTO_STAT_R, sizeof(struct kvproto_stat_r), 0);
	bad(KVPROTO_STAT_R, sizeof(struct kvproto_stat_r) + 8, 0);
}

/* The cuda pool's chunk hand-over (issue #6). */
static void test_pool(void **state)
{
	struct kvproto_pool q = { KVPROTO_VERSION, 0 };
	struct kvproto_pool_r r = { KVPROTO_VERSION, 3, 4u << 20, 2u << 20, 10u << 20,
				    { 1 }, 0, 0 };
	struct kvproto_hdr h = hdr(KVPROTO_POOL, sizeof(q));
	const char *why = NULL;

	(void)state;
	assert_int_equal(kvproto_decode(&h, &q, 0, &why), 0);
	q.flags = 2;
	assert_int_equal(kvproto_decode(&h, &q, 0, &why), -EBADMSG);
	assert_string_equal(why, "POOL flags not zero");
	h.len = sizeof(q) + 1;
	assert_int_equal(kvproto_decode(&h, buf, 0, NULL), -EBADMSG);

	h = hdr(KVPROTO_POOL_R, sizeof(r));
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), 0);
	r.pool_bytes = 12u << 20;	/* exactly n_chunks x chunk_bytes */
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), 0);
	r.pool_bytes = (12u << 20) + 1;	/* more than the chunks hold */
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), -EBADMSG);
	r.pool_bytes = 10u << 20;
	r.chunk_bytes = 3u << 20;	/* not a multiple of the granularity */
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), -EBADMSG);
	r.chunk_bytes = 4u << 20;
	r.n_chunks = 0;
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), -EBADMSG);
	r.n_chunks = KVPROTO_MAX_CHUNKS + 1;
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), -EBADMSG);
	r.n_chunks = 3;
	r.granularity = 0;
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), -EBADMSG);
	r.granularity = 2u << 20;
	r.chunk_bytes = UINT64_MAX / 2 + 1 - (UINT64_MAX / 2 + 1) % (2u << 20);
	assert_int_equal(kvproto_decode(&h, &r, 0, &why), -EBADMSG);	/* overflow */
	assert_non_null(why);
}

/*
 * A non-root client without KVCACHED_SOCKET and without a per-user socket
 * falls back to the system service's socket, if that exists; root and the
 * environment variable never fall back. Runs as uid 65534 in a child when
 * the suite runs as root.
 */
static int client_path_child(const char *dir, const char *sys)
{
	char buf[108], want[108], xdgsock[108];
	int fd;

	if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
		return 10;
	setenv("XDG_RUNTIME_DIR", dir, 1);
	unsetenv("KVCACHED_SOCKET");
	snprintf(want, sizeof(want), "%s/kvcached.sock", dir);
	/* No per-user socket, no system socket: the per-user path. */
	if (kvproto_client_socket_path_in(buf, sizeof(buf), "/nonexistent/k.sock") ||
	    strcmp(buf, want))
		return 11;
	/* No per-user socket, a system one: the system one. */
	if (kvproto_client_socket_path_in(buf, sizeof(buf), sys) || strcmp(buf, sys))
		return 12;
	/* A per-user socket exists: it wins. */
	snprintf(xdgsock, sizeof(xdgsock), "%s/kvcached.sock", dir);
	fd = open(xdgsock, O_CREAT | O_WRONLY, 0600);
	if (fd < 0)
		return 13;
	close(fd);
	if (kvproto_client_socket_path_in(buf, sizeof(buf), sys) || strcmp(buf, want))
		return 14;
	unlink(xdgsock);
	/* The environment always wins. */
	setenv("KVCACHED_SOCKET", "/tmp/explicit.sock", 1);
	if (kvproto_client_socket_path_in(buf, sizeof(buf), sys) ||
	    strcmp(buf, "/tmp/explicit.sock"))
		return 15;
	return 0;
}

static void test_client_socket_fallback(void **state)
{
	char dir[] = "/tmp/kvt-xdg.XXXXXX", sys[128];
	int fd, st;
	pid_t p;

	(void)state;
	assert_non_null(mkdtemp(dir));
	chmod(dir, 0777);
	snprintf(sys, sizeof(sys), "%s/system.sock", dir);
	fd = open(sys, O_CREAT | O_WRONLY, 0644);
	assert_true(fd >= 0);
	close(fd);
	p = fork();
	if (!p)
		_exit(client_path_child(dir, sys));
	assert_int_equal(waitpid(p, &st, 0), p);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	unlink(sys);
	rmdir(dir);
}


int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello),
		cmocka_unit_test(test_alloc),
		cmocka_unit_test(test_alloc_keys),
		cmocka_unit_test(test_pages),
		cmocka_unit_test(test_alloc_r_short_form_only_for_zero),
		cmocka_unit_test(test_hello_ns),
		cmocka_unit_test(test_part),
		cmocka_unit_test(test_stat),
		cmocka_unit_test(test_pool),
		cmocka_unit_test(test_client_socket_fallback),
		cmocka_unit_test(test_publish),
		cmocka_unit_test(test_replies),
		cmocka_unit_test(test_header),
		cmocka_unit_test(test_frame_table),
		cmocka_unit_test_setup_teardown(test_socket_path, env_setup, env_teardown),
	};

	return cmocka_run_group_tests_name("proto", tests, group_setup, group_teardown);
}
