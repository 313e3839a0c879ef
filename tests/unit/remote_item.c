// SPDX-License-Identifier: MIT
/*
 * remote_item.c - the remote tier's item format: the MAC against its
 * construction computed by hand from libsodium's primitives (and with the
 * empty key of --remote-insecure), items of other format versions refused
 * as such, an item that checks as built, and each way one must not (damage, another secret, another
 * namespace, key, parent or tokens, a forged namespace id, the wrong
 * length or geometry), the item key and the prefix rule, the server list.
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

#include <sodium.h>

#include "../../fmt/remote_item.h"
#include "../../shm/proto.h"

/*
 * The MAC is what remote_item.h says, computed here from libsodium's
 * primitives independently of the AEAD call the daemon makes: the item
 * key is BLAKE2b-256 of the secret (personal "kvcached-rmac-v2"); the
 * one-time Poly1305 key is the first 32 bytes of the XChaCha20 keystream
 * (HChaCha20 subkey from the first 16 nonce bytes, then IETF ChaCha20 with
 * nonce 0^4 || the last 8, block 0); the tag is Poly1305 of the item,
 * zero-padded to 16 bytes, then le64(item bytes) and le64(0).
 */
static void mac_by_hand(const char *secret, const uint8_t *item, size_t n, const uint8_t *nonce,
			uint8_t tag[16])
{
	static const unsigned char personal[16] = "kvcached-rmac-v2";
	uint8_t key[32], sub[32], n12[12] = { 0 }, otk[64] = { 0 }, pad[16] = { 0 }, lens[16];
	crypto_onetimeauth_poly1305_state st;
	uint64_t l = n;

	assert_int_equal(crypto_generichash_blake2b_salt_personal(key, 32, (const void *)secret,
								  strlen(secret), NULL, 0, NULL,
								  personal), 0);
	crypto_core_hchacha20(sub, nonce, key, NULL);
	memcpy(n12 + 4, nonce + 16, 8);
	crypto_stream_chacha20_ietf(otk, sizeof(otk), n12, sub);
	crypto_onetimeauth_poly1305_init(&st, otk);
	crypto_onetimeauth_poly1305_update(&st, item, n);
	crypto_onetimeauth_poly1305_update(&st, pad, (16 - n % 16) % 16);
	memcpy(lens, &l, 8);
	memset(lens + 8, 0, 8);
	crypto_onetimeauth_poly1305_update(&st, lens, 16);
	crypto_onetimeauth_poly1305_final(&st, tag);
}

static void mac_is_construction(const char *secret, size_t payload)
{
	size_t n = sizeof(struct kvd_rval_hdr) + payload + KVD_RVAL_MAC, i;
	uint8_t *buf = calloc(1, n), tag[16], nonce[KVD_RVAL_NONCE];
	struct kvd_rmac *m;

	assert_non_null(buf);
	for (i = 0; i < n - KVD_RVAL_MAC; i++)
		buf[i] = (uint8_t)(i * 13 + 7);
	assert_int_equal(kvd_rmac_new(&m, secret, strlen(secret)), 0);
	if (kvd_rmac_sodium_only)
		assert_string_equal(kvd_rmac_impl(m), "libsodium");
	else	/* Debian's OpenSSL 3 has Poly1305 */
		assert_string_equal(kvd_rmac_impl(m), "OpenSSL");
	assert_int_equal(kvd_rval_seal(m, buf, n), 0);
	memcpy(nonce, buf + offsetof(struct kvd_rval_hdr, nonce), sizeof(nonce));
	mac_by_hand(secret, buf, n - KVD_RVAL_MAC, nonce, tag);
	assert_memory_equal(buf + n - KVD_RVAL_MAC, tag, 16);
	/* A second seal draws another nonce, so another one-time key and
	 * another tag; kvd_rval_mac reproduces a tag from the header's nonce. */
	assert_int_equal(kvd_rval_seal(m, buf, n), 0);
	assert_memory_not_equal(buf + offsetof(struct kvd_rval_hdr, nonce), nonce, sizeof(nonce));
	memcpy(tag, buf + n - KVD_RVAL_MAC, 16);
	memset(buf + n - KVD_RVAL_MAC, 0, 16);
	assert_int_equal(kvd_rval_mac(m, buf, n), 0);
	assert_memory_equal(buf + n - KVD_RVAL_MAC, tag, 16);
	assert_int_equal(kvd_rval_seal(m, buf, sizeof(struct kvd_rval_hdr)), -EINVAL);
	/* libsodium's one-shot AEAD over the same bytes gives the same tag
	 * (the daemon computes it piece by piece, where the parts lie). */
	{
		static const unsigned char personal[16] = "kvcached-rmac-v2";
		uint8_t key[32], one[16], none[1] = { 0 };
		unsigned long long tl = 0;

		assert_int_equal(crypto_generichash_blake2b_salt_personal(
					 key, 32, (const void *)secret, strlen(secret), NULL, 0, NULL,
					 personal), 0);
		assert_int_equal(crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
					 none, one, &tl, none, 0, buf, n - KVD_RVAL_MAC, NULL,
					 buf + offsetof(struct kvd_rval_hdr, nonce), key), 0);
		assert_memory_equal(one, tag, 16);
	}
	/* Sealed in pieces (header, then the rest cut anywhere, as a put
	 * sends header and tokens from a buffer and the payload from its
	 * page): the tag of the same bytes in one buffer; and checked in
	 * pieces by kvd_rval_check_v (tests below). */
	if (n - KVD_RVAL_MAC > sizeof(struct kvd_rval_hdr) + 1) {
		size_t h = sizeof(struct kvd_rval_hdr), cut = h + (n - KVD_RVAL_MAC - h) / 3;
		struct kvd_rpiece p[3] = { { buf, h }, { buf + h, cut - h },
					   { buf + cut, n - KVD_RVAL_MAC - cut } };
		uint8_t piece_tag[16];

		assert_int_equal(kvd_rval_seal_v(m, p, 3, piece_tag), 0);
		memset(buf + n - KVD_RVAL_MAC, 0, 16);
		assert_int_equal(kvd_rval_mac(m, buf, n), 0);
		assert_memory_equal(buf + n - KVD_RVAL_MAC, piece_tag, 16);
	}
	kvd_rmac_free(m);
	free(buf);
}

static void test_mac_construction(void **state)
{
	int k;

	(void)state;
	/* Poly1305 from OpenSSL (where it has it), then from libsodium:
	 * the same tags either way. */
	for (k = 0; k < 2; k++) {
		kvd_rmac_sodium_only = k == 1;
		mac_is_construction("cluster secret, thirty-two bytes", 4096);
		mac_is_construction("cluster secret, thirty-two bytes", 17);	/* padding */
		mac_is_construction("cluster secret, thirty-two bytes", 2u << 20);
		/* The empty secret (--remote-insecure). */
		mac_is_construction("", 0);
	}
	kvd_rmac_sodium_only = false;
}

struct blk {
	struct kvshm_ns ns;
	uint32_t tokens[16];
	struct kvd_rval_want w;
	uint8_t *item;
	size_t len;
};

static void make_ns(struct kvshm_ns *ns, const char *model, uint32_t layers)
{
	struct kvproto_hello hi = { .dtype_bytes = 2, .layers = layers, .kv_heads = 2,
				    .head_dim = 32, .block_tokens = 16, .pos_kind = KVSHM_POS_ROPE };

	strcpy(hi.model, model);
	assert_int_equal(kvproto_hello_ns(&hi, ns), 0);
}

/* A block of the test model, sealed under m. */
static void make_blk(struct blk *b, struct kvd_rmac *m)
{
	size_t off = kvd_rval_payload_off(16), i;

	make_ns(&b->ns, "kvt-tiny", 1);
	for (i = 0; i < 16; i++)
		b->tokens[i] = (uint32_t)(1000 + i);
	b->w = (struct kvd_rval_want){ &b->ns, { 11, 12 }, { 13, 14 }, b->tokens, 16 };
	b->len = kvd_rval_bytes(16, b->ns.page_bytes);
	assert_int_equal(b->len, sizeof(struct kvd_rval_hdr) + 64 + 4096 + KVD_RVAL_MAC);
	b->item = malloc(b->len);
	assert_non_null(b->item);
	kvd_rval_fill(b->item, &b->ns, b->w.key, b->w.parent, b->tokens, 16, b->ns.page_bytes);
	for (i = 0; i < b->ns.page_bytes; i++)
		b->item[off + i] = (uint8_t)(i * 31);
	assert_int_equal(kvd_rval_seal(m, b->item, b->len), 0);
}

static void refused(struct kvd_rmac *m, const struct blk *b, const struct kvd_rval_want *w,
		    size_t len, enum kvd_rval_fail want)
{
	enum kvd_rval_fail fail;
	const char *why = NULL;

	assert_int_equal(kvd_rval_check(m, b->item, len, w, &fail, &why), -EBADMSG);
	assert_int_equal(fail, want);
	assert_non_null(why);
}

static void test_item_checks(void **state)
{
	struct kvd_rmac *m, *other, *none;
	struct kvd_rval_want w;
	enum kvd_rval_fail fail;
	struct kvshm_ns ns2;
	uint32_t tok2[16];
	const char *why;
	struct blk b;

	(void)state;
	assert_int_equal(kvd_rmac_new(&m, "cluster secret, thirty-two bytes", 32), 0);
	assert_int_equal(kvd_rmac_new(&other, "another secret, thirty-two bytes", 32), 0);
	assert_int_equal(kvd_rmac_new(&none, "", 0), 0);
	make_blk(&b, m);
	assert_int_equal(kvd_rval_check(m, b.item, b.len, &b.w, &fail, &why), 0);
	assert_int_equal(fail, KVD_RVAL_OK);
	/* In pieces, as a fetch reads it (header and tokens into a buffer,
	 * the payload into its page, the tag): the payload checked where it
	 * lies; one byte of it changed there, refused. */
	{
		size_t off = kvd_rval_payload_off(16), pl = b.ns.page_bytes;
		uint8_t *head = malloc(off), *page = malloc(pl), tag[16];

		assert_non_null(head);
		assert_non_null(page);
		memcpy(head, b.item, off);
		memcpy(page, b.item + off, pl);
		memcpy(tag, b.item + off + pl, 16);
		assert_int_equal(kvd_rval_check_v(m, head, off, page, pl, tag, b.len, &b.w, &fail,
						  &why), 0);
		page[pl / 2] ^= 1;
		assert_int_equal(kvd_rval_check_v(m, head, off, page, pl, tag, b.len, &b.w, &fail,
						  &why), -EBADMSG);
		assert_int_equal(fail, KVD_RVAL_BADMAC);
		/* Not of its block's length: no payload read, refused. */
		assert_int_equal(kvd_rval_check_v(m, head, off, NULL, 0, NULL, b.len + 1, &b.w,
						  &fail, &why), -EBADMSG);
		assert_int_equal(fail, KVD_RVAL_FORMAT);
		free(head);
		free(page);
	}
	/* Another secret, and none at all. */
	refused(other, &b, &b.w, b.len, KVD_RVAL_BADMAC);
	refused(none, &b, &b.w, b.len, KVD_RVAL_BADMAC);
	/* Length and geometry. */
	refused(m, &b, &b.w, b.len - 1, KVD_RVAL_FORMAT);
	refused(m, &b, &b.w, 10, KVD_RVAL_FORMAT);
	w = b.w;
	make_ns(&ns2, "kvt-tiny", 2);	/* pages twice as big */
	w.ns = &ns2;
	refused(m, &b, &w, b.len, KVD_RVAL_FORMAT);
	/* Same geometry, another model: the namespace differs. */
	make_ns(&ns2, "kvt-other", 1);
	w.ns = &ns2;
	refused(m, &b, &w, b.len, KVD_RVAL_IDENTITY);
	/* Another key, parent, tokens. */
	w = b.w;
	w.key.hi ^= 1;
	refused(m, &b, &w, b.len, KVD_RVAL_IDENTITY);
	w = b.w;
	w.parent.lo ^= 1;
	refused(m, &b, &w, b.len, KVD_RVAL_IDENTITY);
	memcpy(tok2, b.tokens, sizeof(tok2));
	tok2[15]++;
	w = b.w;
	w.tokens = tok2;
	refused(m, &b, &w, b.len, KVD_RVAL_TOKENS);
	/* Damage anywhere: payload, header, tokens, the MAC itself. */
	for (size_t at = 0; at < b.len; at += at < 128 ? 5 : 97) {
		b.item[at] ^= 0x40;
		/* magic, version, block tokens, payload length: refused
		 * before the MAC is computed; the nonce is MAC'd */
		refused(m, &b, &b.w, b.len,
			at >= 8 && at < 12 ? KVD_RVAL_VERSION_OTHER
			: at < 16 || (at >= 48 && at < 56) ? KVD_RVAL_FORMAT : KVD_RVAL_BADMAC);
		b.item[at] ^= 0x40;
	}
	/* A sealed item whose namespace id does not follow from its geometry
	 * (a host with the secret, lying): refused. */
	{
		struct kvd_rval_hdr h;

		memcpy(&h, b.item, sizeof(h));
		h.ns.id.lo ^= 1;
		memcpy(b.item, &h, sizeof(h));
		assert_int_equal(kvd_rval_seal(m, b.item, b.len), 0);
		refused(m, &b, &b.w, b.len, KVD_RVAL_IDENTITY);
	}
	/* Insecure on both ends: it checks. */
	free(b.item);
	make_blk(&b, none);
	assert_int_equal(kvd_rval_check(none, b.item, b.len, &b.w, &fail, &why), 0);
	free(b.item);
	kvd_rmac_free(m);
	kvd_rmac_free(other);
	kvd_rmac_free(none);
}

/* Items of the previous format (HMAC-SHA256, 32-byte MAC, no nonce) and of
 * a later one are refused for their version, before their MAC or length:
 * the daemon counts them as stale misses, not as damage. */
static void test_other_versions(void **state)
{
	struct kvd_rmac *m;
	enum kvd_rval_fail fail;
	struct kvd_rval_hdr h;
	struct blk b;
	uint32_t v[] = { 1, KVD_RVAL_VERSION + 1, UINT32_MAX };

	(void)state;
	assert_int_equal(kvd_rmac_new(&m, "cluster secret, thirty-two bytes", 32), 0);
	make_blk(&b, m);
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		memcpy(&h, b.item, sizeof(h));
		h.version = v[i];
		memcpy(b.item, &h, sizeof(h));
		assert_int_equal(kvd_rval_mac(m, b.item, b.len), 0);	/* a good MAC */
		refused(m, &b, &b.w, b.len, KVD_RVAL_VERSION_OTHER);
		/* A version-1 item was 16 bytes longer (its MAC): still a
		 * version refusal, not a length one. */
		refused(m, &b, &b.w, b.len - 1, KVD_RVAL_VERSION_OTHER);
	}
	h.version = KVD_RVAL_VERSION;
	memcpy(b.item, &h, sizeof(h));
	assert_int_equal(kvd_rval_mac(m, b.item, b.len), 0);
	assert_int_equal(kvd_rval_check(m, b.item, b.len, &b.w, &fail, &(const char *){ NULL }), 0);
	free(b.item);
	kvd_rmac_free(m);
}

static void test_keys_and_prefix(void **state)
{
	char k[KVD_RVAL_KEY_MAX], big[KVD_RVAL_PREFIX_MAX + 1];

	(void)state;
	assert_int_equal(kvd_rval_key(k, "kvc", (struct kvshm_key){ 1, 2 },
				      (struct kvshm_key){ 0xfedcba9876543210ull, 0xf }),
			 3 + 1 + 32 + 1 + 32);
	assert_string_equal(k, "kvc:00000000000000020000000000000001:"
			       "000000000000000ffedcba9876543210");
	assert_true(kvd_rval_prefix_ok("fleet-1.a_B9"));
	assert_false(kvd_rval_prefix_ok(""));
	assert_false(kvd_rval_prefix_ok("a b"));
	assert_false(kvd_rval_prefix_ok("a:b"));
	assert_false(kvd_rval_prefix_ok("a\nb"));
	memset(big, 'a', KVD_RVAL_PREFIX_MAX - 1);
	big[KVD_RVAL_PREFIX_MAX - 1] = 0;
	assert_true(kvd_rval_prefix_ok(big));
	assert_true(kvd_rval_key(k, big, (struct kvshm_key){ 0, 0 }, (struct kvshm_key){ 0, 0 }) <
		    KVD_RVAL_KEY_MAX);
	big[KVD_RVAL_PREFIX_MAX - 1] = 'a';
	big[KVD_RVAL_PREFIX_MAX] = 0;
	assert_false(kvd_rval_prefix_ok(big));
}

static void test_server_list(void **state)
{
	struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS];
	const char *why;
	unsigned n;

	(void)state;
	assert_int_equal(kvd_remote_parse("memcached:10.0.0.1:11211,[::1]:7,/run/mc.sock,h-2.x:1",
					  sv, KVD_REMOTE_MAX_SERVERS, &n, &why), 0);
	assert_int_equal(n, 4);
	assert_string_equal(sv[0].host, "10.0.0.1");
	assert_int_equal(sv[0].port, 11211);
	assert_string_equal(sv[1].host, "::1");
	assert_int_equal(sv[1].port, 7);
	assert_string_equal(sv[2].host, "/run/mc.sock");
	assert_int_equal(sv[2].port, 0);
	assert_string_equal(sv[3].host, "h-2.x");
	assert_int_equal(kvd_remote_parse("memcached:a:1,b:2", sv, 1, &n, &why), -EINVAL);
	assert_non_null(strstr(why, "more servers"));
	assert_int_equal(kvd_remote_parse("memcached:a:1,,b:2", sv, 4, &n, &why), -EINVAL);
	assert_int_equal(kvd_remote_parse("memcached:a:", sv, 4, &n, &why), -EINVAL);
	assert_int_equal(kvd_remote_parse("memcached:a:1x", sv, 4, &n, &why), -EINVAL);
	assert_int_equal(kvd_remote_parse("memcache:a:1", sv, 4, &n, &why), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mac_construction),
		cmocka_unit_test(test_other_versions),
		cmocka_unit_test(test_item_checks),
		cmocka_unit_test(test_keys_and_prefix),
		cmocka_unit_test(test_server_list),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
