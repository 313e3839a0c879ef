// SPDX-License-Identifier: MIT
/*
 * remote_val.c - fuzz target for the remote tier's formats: the item a
 * daemon fetches from memcached (kvd_rval_check, which every fetched item
 * passes through before a byte of it reaches a page), and the --remote
 * server list (kvd_remote_parse) and item-key prefix.
 *
 * Input: byte 0 picks the mode, byte 1 the block tokens (1..64), byte 2
 * which of two secrets the daemon holds (0: none, --remote-insecure).
 *   mode 0: the rest is an item as fetched, checked against a fixed
 *     block (a small namespace, key, parent, tokens);
 *   mode 1: the rest describes a valid block (geometry, model name, key,
 *     parent, tokens, payload bytes), which kvd_rval_fill and
 *     kvd_rval_seal make into an item; then pairs of (offset, xor) bytes
 *     damage it;
 *   mode 2: the rest is a --remote value (and a prefix);
 *   mode 3: the rest is what a memcached server answers, cut into lines
 *     at each LF (kvd_mc_parse, remote_conn.c, which reads every reply
 *     line of a put or a fetch).
 *
 * Oracle: no crash, no leak. An item the checker accepts has exactly the
 * length of its block, names exactly the block asked for (namespace,
 * key, parent, tokens), and seals back to the same bytes under the
 * daemon's secret and its own nonce. An item of another format version is
 * refused as such (KVD_RVAL_VERSION_OTHER), whatever else it holds. A built item is accepted as built; damaged anywhere
 * (MAC included) it is never accepted, and not under another secret
 * either; asked for other tokens, another key or parent, it is refused
 * for that reason. A server list that parses reads back the same when
 * written out again. A reply line parses as one kind; a VALUE's key lies
 * inside the line, is 1..250 bytes of no space or control character, its
 * length is at most KVD_MC_VALUE_MAX, and the line written out again as
 * "VALUE <key> 0 <bytes>" reads back the same; any other kind has no key.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../daemon/tier/remote_conn.h"
#include "../../fmt/remote_item.h"
#include "../../shm/proto.h"

#include "check.h"

static const char secret_a[] = "fuzz secret number one, 32 bytes";
static const char secret_b[] = "fuzz secret number two, 32 bytes";
static struct kvd_rmac *macs[3];	/* none, a, b */

static void setup_once(void)
{
	CHECK(!kvd_rmac_new(&macs[0], "", 0));
	CHECK(!kvd_rmac_new(&macs[1], secret_a, sizeof(secret_a) - 1));
	CHECK(!kvd_rmac_new(&macs[2], secret_b, sizeof(secret_b) - 1));
}

/* A namespace as a HELLO declares it. */
static void make_ns(struct kvshm_ns *ns, uint32_t bt, uint32_t dt, uint32_t layers,
		    uint32_t heads, uint32_t hd, const char *model)
{
	struct kvproto_hello hi;

	memset(&hi, 0, sizeof(hi));
	hi.dtype_bytes = dt;
	hi.layers = layers;
	hi.kv_heads = heads;
	hi.head_dim = hd;
	hi.block_tokens = bt;
	hi.pos_kind = KVSHM_POS_ROPE;
	snprintf(hi.model, sizeof(hi.model), "%s", model);
	CHECK(!kvproto_hello_ns(&hi, ns));
}

static void check_accepted(const uint8_t *item, size_t len, const struct kvd_rval_want *w,
			   struct kvd_rmac *m)
{
	struct kvd_rval_hdr h;
	uint8_t *again = malloc(len);

	CHECK(again);
	CHECK(len == kvd_rval_bytes(w->bt, w->ns->page_bytes));
	memcpy(&h, item, sizeof(h));
	CHECK(h.magic == KVD_RVAL_MAGIC && h.version == KVD_RVAL_VERSION);
	CHECK(kvshm_key_eq(h.key, w->key) && kvshm_key_eq(h.parent, w->parent));
	CHECK(h.payload_bytes == w->ns->page_bytes && h.block_tokens == w->bt);
	CHECK(!memcmp(item + sizeof(h), w->tokens, (size_t)w->bt * 4));
	/* Built again from what it says, sealed again: the same bytes. */
	kvd_rval_fill(again, w->ns, w->key, w->parent, w->tokens, w->bt, w->ns->page_bytes);
	memcpy(again + kvd_rval_payload_off(w->bt), item + kvd_rval_payload_off(w->bt),
	       (size_t)w->ns->page_bytes);
	memcpy(again + offsetof(struct kvd_rval_hdr, nonce), h.nonce, KVD_RVAL_NONCE);
	CHECK(!kvd_rval_mac(m, again, len));
	CHECK(!memcmp(again, item, len));
	free(again);
}

static void mode_raw(const uint8_t *d, size_t n, uint32_t bt, unsigned sec)
{
	static uint32_t tokens[64];
	struct kvshm_ns ns;
	struct kvd_rval_want w;
	enum kvd_rval_fail fail;
	const char *why;
	uint8_t *item = malloc(n ? n : 1);
	uint32_t i;

	CHECK(item);
	memcpy(item, d, n);
	for (i = 0; i < bt; i++)
		tokens[i] = i * 7 + 1;
	make_ns(&ns, bt, 1, 1, 1, 4, "fuzz");
	w = (struct kvd_rval_want){ &ns, { 1, 2 }, { 3, 4 }, tokens, bt };
	if (!kvd_rval_check(macs[sec], item, n, &w, &fail, &why)) {
		check_accepted(item, n, &w, macs[sec]);
	} else {
		struct kvd_rval_hdr h;

		CHECK(fail != KVD_RVAL_OK && why);
		if (n >= sizeof(h)) {
			memcpy(&h, item, sizeof(h));
			CHECK((h.magic == KVD_RVAL_MAGIC && h.version != KVD_RVAL_VERSION) ==
			      (fail == KVD_RVAL_VERSION_OTHER));
		}
	}
	free(item);
}

static uint32_t take32(const uint8_t **d, size_t *n)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++)
		if (*n) {
			v |= (uint32_t)**d << (8 * i);
			(*d)++;
			(*n)--;
		}
	return v;
}

static void mode_built(const uint8_t *d, size_t n, uint32_t bt, unsigned sec)
{
	static const uint32_t dts[4] = { 1, 2, 4, 8 };
	uint32_t tokens[64], other[64], g = take32(&d, &n), i;
	struct kvshm_key key = { take32(&d, &n), take32(&d, &n) };
	struct kvshm_key parent = { take32(&d, &n), 9 };
	struct kvshm_ns ns;
	struct kvd_rval_want w;
	enum kvd_rval_fail fail;
	const char *why;
	char model[16];
	uint8_t *item;
	size_t len, off;

	snprintf(model, sizeof(model), "m%u", g >> 16);
	/* Pages of at most 8 * 2 * 2 * 2 * 4 * 64 tokens: 16 KiB a block token. */
	make_ns(&ns, bt, dts[g & 3], 1 + (g >> 2 & 1), 1 + (g >> 3 & 1), 1 + (g >> 4 & 3), model);
	for (i = 0; i < bt; i++)
		tokens[i] = take32(&d, &n);
	len = kvd_rval_bytes(bt, ns.page_bytes);
	off = kvd_rval_payload_off(bt);
	item = calloc(1, len);
	CHECK(item);
	kvd_rval_fill(item, &ns, key, parent, tokens, bt, ns.page_bytes);
	for (i = 0; i < ns.page_bytes && i < n; i++)
		item[off + i] = d[i];
	CHECK(!kvd_rval_seal(macs[sec], item, len));
	w = (struct kvd_rval_want){ &ns, key, parent, tokens, bt };
	CHECK(!kvd_rval_check(macs[sec], item, len, &w, &fail, &why));
	check_accepted(item, len, &w, macs[sec]);
	/* Another secret: refused, for its MAC. */
	CHECK(kvd_rval_check(macs[(sec + 1) % 3], item, len, &w, &fail, &why) == -EBADMSG &&
	      fail == KVD_RVAL_BADMAC);
	/* Asked for other tokens, key or parent: refused for that. */
	memcpy(other, tokens, sizeof(uint32_t) * bt);
	other[g % bt] ^= 1;
	w.tokens = other;
	CHECK(kvd_rval_check(macs[sec], item, len, &w, &fail, &why) == -EBADMSG &&
	      fail == KVD_RVAL_TOKENS);
	w.tokens = tokens;
	w.key.lo ^= 1;
	CHECK(kvd_rval_check(macs[sec], item, len, &w, &fail, &why) == -EBADMSG &&
	      fail == KVD_RVAL_IDENTITY);
	w.key = key;
	w.parent.hi ^= 1;
	CHECK(kvd_rval_check(macs[sec], item, len, &w, &fail, &why) == -EBADMSG &&
	      fail == KVD_RVAL_IDENTITY);
	w.parent = parent;
	/* Another format version (the MAC made good again, as by a host of
	 * that release): refused for its version, before its MAC; then the
	 * item as built again. */
	{
		struct kvd_rval_hdr h;
		uint32_t v;

		memcpy(&h, item, sizeof(h));
		v = h.version;
		h.version = g & 1 ? 1 : KVD_RVAL_VERSION + 1;	/* the last one, the next */
		memcpy(item, &h, sizeof(h));
		CHECK(!kvd_rval_mac(macs[sec], item, len));
		CHECK(kvd_rval_check(macs[sec], item, len, &w, &fail, &why) == -EBADMSG &&
		      fail == KVD_RVAL_VERSION_OTHER);
		h.version = v;
		memcpy(item, &h, sizeof(h));
		CHECK(!kvd_rval_mac(macs[sec], item, len));
		CHECK(!kvd_rval_check(macs[sec], item, len, &w, &fail, &why));
	}
	/* Damage: (offset, xor) pairs from the input's tail. */
	if (n >= ns.page_bytes + 3) {
		const uint8_t *p = d + ns.page_bytes;
		size_t left = n - ns.page_bytes, k;
		uint8_t *orig = malloc(len);

		CHECK(orig);
		memcpy(orig, item, len);
		for (k = 0; k + 3 <= left && k < 3 * 8; k += 3) {
			size_t at = ((size_t)p[k] | (size_t)p[k + 1] << 8) % len;

			item[at] ^= p[k + 2];
		}
		if (memcmp(orig, item, len))
			CHECK(kvd_rval_check(macs[sec], item, len, &w, &fail, &why) == -EBADMSG);
		free(orig);
	}
	/* Cut short or grown: refused. */
	CHECK(kvd_rval_check(macs[sec], item, len - 1, &w, &fail, &why) == -EBADMSG);
	free(item);
}

static void mode_servers(const uint8_t *d, size_t n)
{
	struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS], again[KVD_REMOTE_MAX_SERVERS];
	char *s = malloc(n + 1), *out;
	const char *why = NULL;
	unsigned k, m, i;
	size_t at;

	CHECK(s);
	memcpy(s, d, n);
	s[n] = 0;
	(void)kvd_rval_prefix_ok(s);
	if (kvd_remote_parse(s, sv, KVD_REMOTE_MAX_SERVERS, &k, &why)) {
		CHECK(why);
		free(s);
		return;
	}
	CHECK(k >= 1 && k <= KVD_REMOTE_MAX_SERVERS);
	out = malloc(16 + k * 300);
	CHECK(out);
	at = (size_t)sprintf(out, "memcached:");
	for (i = 0; i < k; i++) {
		CHECK(sv[i].host[0]);
		if (!sv[i].port)
			at += (size_t)sprintf(out + at, "%s%s", i ? "," : "", sv[i].host);
		else if (strchr(sv[i].host, ':'))
			at += (size_t)sprintf(out + at, "%s[%s]:%u", i ? "," : "", sv[i].host,
					      sv[i].port);
		else
			at += (size_t)sprintf(out + at, "%s%s:%u", i ? "," : "", sv[i].host,
					      sv[i].port);
	}
	CHECK(!kvd_remote_parse(out, again, KVD_REMOTE_MAX_SERVERS, &m, &why));
	CHECK(m == k);
	for (i = 0; i < k; i++)
		CHECK(!strcmp(again[i].host, sv[i].host) && again[i].port == sv[i].port);
	free(out);
	free(s);
}

static void mode_replies(const uint8_t *d, size_t n)
{
	size_t at = 0, e, kl, kl2, i;
	const char *key, *key2;
	uint64_t bytes, b2;
	char again[KVD_MC_LINE_MAX + 64];
	enum kvd_mc_line kind;
	char *s = malloc(n + 1);

	CHECK(s);
	memcpy(s, d, n);
	while (at <= n) {
		for (e = at; e < n && s[e] != '\n'; e++)
			;
		/* The line without its CR, as remote_conn.c hands it over. */
		kind = kvd_mc_parse(s + at, e > at && s[e - 1] == '\r' ? e - 1 - at : e - at, &key,
				    &kl, &bytes);
		CHECK(kind >= KVD_MC_BAD && kind <= KVD_MC_ERROR);
		if (kind == KVD_MC_VALUE) {
			CHECK(key >= s + at && key + kl <= s + e);
			CHECK(kl >= 1 && kl <= 250 && bytes <= KVD_MC_VALUE_MAX);
			for (i = 0; i < kl; i++)
				CHECK((unsigned char)key[i] > ' ' && (unsigned char)key[i] != 0x7f);
			i = (size_t)snprintf(again, sizeof(again), "VALUE %.*s 0 %llu", (int)kl, key,
					     (unsigned long long)bytes);
			CHECK(kvd_mc_parse(again, i, &key2, &kl2, &b2) == KVD_MC_VALUE);
			CHECK(kl2 == kl && !memcmp(key2, key, kl) && b2 == bytes);
		} else {
			CHECK(!key && !kl && !bytes);
		}
		at = e + 1;
	}
	free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t bt;
	unsigned sec;

	if (!macs[0])
		setup_once();
	if (size < 3)
		return 0;
	bt = 1 + data[1] % 64;
	sec = data[2] % 3;
	switch (data[0] % 4) {
	case 0:
		mode_raw(data + 3, size - 3, bt, sec);
		break;
	case 1:
		mode_built(data + 3, size - 3, bt, sec);
		break;
	case 2:
		mode_servers(data + 3, size - 3);
		break;
	default:
		mode_replies(data + 3, size - 3);
		break;
	}
	return 0;
}
