// SPDX-License-Identifier: MIT
/*
 * remote_item.c - building and checking remote-store items (see
 * remote_item.h). Pure functions over memory (but for the nonce a seal
 * draws); the MAC from libsodium.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <sodium.h>

#include "../shm/proto.h"
#include "remote_item.h"

/*
 * The MAC (format version 2): the Poly1305 tag of XChaCha20-Poly1305
 * (libsodium's crypto_aead_xchacha20poly1305_ietf) sealing an empty
 * message with the whole item before the tag as associated data, under
 * the item's own random 24-byte nonce (in its header) and the key derived
 * from the cluster secret. So each item is authenticated by Poly1305 under
 * a one-time key that XChaCha20 derives from the secret and the nonce: a
 * PRF-derived per-item key, as the construction requires. Version 1 used
 * HMAC-SHA256; docs/BENCHMARKS.md ("Remote tier: the MAC") has the
 * figures behind the change.
 */
struct kvd_rmac {
	uint8_t key[crypto_aead_xchacha20poly1305_ietf_KEYBYTES];
	/* Poly1305 itself from OpenSSL, whose AVX2 code ran at 6.7 GB/s on
	 * the development VM against libsodium 1.0.18's 3.6: the same tag
	 * (RFC 8439's Poly1305 either way; tests/unit/remote_item.c checks it
	 * against libsodium's one-shot AEAD). NULL where OpenSSL offers no
	 * Poly1305 (a FIPS provider): libsodium's then. */
	EVP_MAC_CTX *poly;
};

bool kvd_rmac_sodium_only;

/* OpenSSL's Poly1305 MAC context, or NULL. */
static EVP_MAC_CTX *poly_new(void)
{
	EVP_MAC *mac;
	EVP_MAC_CTX *ctx;

	if (kvd_rmac_sodium_only)
		return NULL;
	mac = EVP_MAC_fetch(NULL, "POLY1305", NULL);
	ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	EVP_MAC_free(mac);
	return ctx;
}

_Static_assert(crypto_aead_xchacha20poly1305_ietf_ABYTES == KVD_RVAL_MAC, "tag bytes");
_Static_assert(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES == KVD_RVAL_NONCE, "nonce bytes");

int kvd_rmac_new(struct kvd_rmac **out, const void *secret, size_t len)
{
	/* crypto_generichash_blake2b_PERSONALBYTES (16), no NUL. */
	static const unsigned char ctx[16] = "kvcached-rmac-v2";
	struct kvd_rmac *m;

	*out = NULL;
	if (sodium_init() < 0)
		return -EIO;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->poly = poly_new();
	/* The key: BLAKE2b-256 of the secret (any length), keyed by nothing,
	 * personalised by a context string so that no other use of the same
	 * secret shares it. An empty secret (--remote-insecure) gives a fixed
	 * key: damage is still caught, nothing is authenticated. */
	if (crypto_generichash_blake2b_salt_personal(m->key, sizeof(m->key), secret, len, NULL, 0,
						     NULL, ctx)) {
		kvd_rmac_free(m);
		return -EIO;
	}
	*out = m;
	return 0;
}

const char *kvd_rmac_impl(const struct kvd_rmac *m)
{
	return m->poly ? "OpenSSL" : "libsodium";
}

void kvd_rmac_free(struct kvd_rmac *m)
{
	if (!m)
		return;
	sodium_memzero(m->key, sizeof(m->key));
	EVP_MAC_CTX_free(m->poly);
	free(m);
}

int kvd_rmac_dup(struct kvd_rmac **out, const struct kvd_rmac *m)
{
	struct kvd_rmac *n = calloc(1, sizeof(*n));

	*out = NULL;
	if (!n)
		return -ENOMEM;
	memcpy(n->key, m->key, sizeof(n->key));
	n->poly = m->poly ? poly_new() : NULL;
	*out = n;
	return 0;
}

/*
 * The tag of the pieces p[0..n) (together the associated data) under
 * nonce into mac: libsodium's XChaCha20-Poly1305 (IETF) sealing an empty
 * message, computed as its crypto_aead_chacha20poly1305_ietf does
 * (aead_chacha20poly1305.c), one piece at a time: the one-time Poly1305
 * key is the first 32 bytes of ChaCha20 block 0 under HChaCha20(key,
 * nonce[0..16)) and (0^4 || nonce[16..24)); the MAC covers the data,
 * zeros to a multiple of 16, then the data's length and the message's
 * (0) as 64-bit little-endian. So an item is sealed and checked where
 * its parts lie (its payload in a pool page) with no copy, and its tag
 * is exactly the one-shot call's (tests/unit/remote_item.c compares them).
 */
static int mac_pieces(const struct kvd_rmac *m, const struct kvd_rpiece *p, int n,
		      const uint8_t *nonce, uint8_t mac[KVD_RVAL_MAC])
{
	static const uint8_t zeros[16];
	uint8_t k2[crypto_core_hchacha20_OUTPUTBYTES], npub2[crypto_stream_chacha20_ietf_NONCEBYTES];
	uint8_t block0[64], lens[16];
	crypto_onetimeauth_poly1305_state st;
	uint64_t len = 0;
	size_t outl = 0;
	int i, b, rc = 0;

	memset(npub2, 0, 4);
	memcpy(npub2 + 4, nonce + crypto_core_hchacha20_INPUTBYTES, sizeof(npub2) - 4);
	if (crypto_core_hchacha20(k2, nonce, m->key, NULL) ||
	    crypto_stream_chacha20_ietf(block0, sizeof(block0), npub2, k2))
		rc = -EIO;
	sodium_memzero(k2, sizeof(k2));
	for (i = 0; i < n; i++)
		len += p[i].len;
	for (b = 0; b < 8; b++) {
		lens[b] = (uint8_t)(len >> (8 * b));
		lens[8 + b] = 0;	/* the empty message */
	}
	if (!rc && m->poly) {
		/* EVP_MAC_init with a key: the one-time key, 32 bytes. */
		if (!EVP_MAC_init(m->poly, block0, 32, NULL))
			rc = -EIO;
		for (i = 0; !rc && i < n; i++)
			if (p[i].len && !EVP_MAC_update(m->poly, p[i].base, p[i].len))
				rc = -EIO;
		if (!rc && (((0x10 - len) & 0xf &&
			     !EVP_MAC_update(m->poly, zeros, (0x10 - len) & 0xf)) ||
			    !EVP_MAC_update(m->poly, lens, sizeof(lens)) ||
			    !EVP_MAC_final(m->poly, mac, &outl, KVD_RVAL_MAC) || outl != KVD_RVAL_MAC))
			rc = -EIO;
	} else if (!rc) {
		crypto_onetimeauth_poly1305_init(&st, block0);
		for (i = 0; i < n; i++)
			crypto_onetimeauth_poly1305_update(&st, p[i].base, p[i].len);
		crypto_onetimeauth_poly1305_update(&st, zeros, (0x10 - len) & 0xf);
		crypto_onetimeauth_poly1305_update(&st, lens, sizeof(lens));
		crypto_onetimeauth_poly1305_final(&st, mac);
		sodium_memzero(&st, sizeof(st));
	}
	sodium_memzero(block0, sizeof(block0));
	return rc;
}

size_t kvd_rval_payload_off(uint32_t bt)
{
	return sizeof(struct kvd_rval_hdr) + (size_t)bt * sizeof(uint32_t);
}

size_t kvd_rval_bytes(uint32_t bt, uint64_t payload_bytes)
{
	return kvd_rval_payload_off(bt) + (size_t)payload_bytes + KVD_RVAL_MAC;
}

/* The identity part of a namespace row: everything after `used`. */
#define NS_ID_OFF offsetof(struct kvshm_ns, dtype_bytes)
#define NS_ID_LEN (sizeof(struct kvshm_ns) - NS_ID_OFF)

void kvd_rval_fill(void *buf, const struct kvshm_ns *ns, struct kvshm_key key,
		   struct kvshm_key parent, const uint32_t *tokens, uint32_t bt,
		   uint64_t payload_bytes)
{
	struct kvd_rval_hdr h;

	memset(&h, 0, sizeof(h));
	h.magic = KVD_RVAL_MAGIC;
	h.version = KVD_RVAL_VERSION;
	h.block_tokens = bt;
	h.key = key;
	h.parent = parent;
	h.payload_bytes = payload_bytes;
	memcpy((char *)&h.ns + NS_ID_OFF, (const char *)ns + NS_ID_OFF, NS_ID_LEN);
	memcpy(buf, &h, sizeof(h));
	memcpy((char *)buf + sizeof(h), tokens, (size_t)bt * sizeof(uint32_t));
}

int kvd_rval_seal(struct kvd_rmac *m, void *buf, size_t len)
{
	struct kvd_rpiece p = { buf, len - KVD_RVAL_MAC };

	if (len < sizeof(struct kvd_rval_hdr) + KVD_RVAL_MAC)
		return -EINVAL;
	return kvd_rval_seal_v(m, &p, 1, (uint8_t *)buf + len - KVD_RVAL_MAC);
}

int kvd_rval_seal_v(struct kvd_rmac *m, const struct kvd_rpiece *p, int n,
		    uint8_t mac[KVD_RVAL_MAC])
{
	uint8_t *nonce = (uint8_t *)p[0].base + offsetof(struct kvd_rval_hdr, nonce);

	if (n < 1 || p[0].len < sizeof(struct kvd_rval_hdr))
		return -EINVAL;
	randombytes_buf(nonce, KVD_RVAL_NONCE);
	return mac_pieces(m, p, n, nonce, mac);
}

int kvd_rval_mac(struct kvd_rmac *m, void *buf, size_t len)
{
	struct kvd_rpiece p = { buf, len - KVD_RVAL_MAC };

	if (len < sizeof(struct kvd_rval_hdr) + KVD_RVAL_MAC)
		return -EINVAL;
	return mac_pieces(m, &p, 1, (const uint8_t *)buf + offsetof(struct kvd_rval_hdr, nonce),
			  (uint8_t *)buf + len - KVD_RVAL_MAC);
}

static int refuse(enum kvd_rval_fail *fail, const char **why, enum kvd_rval_fail f,
		  const char *w)
{
	*fail = f;
	*why = w;
	return -EBADMSG;
}

int kvd_rval_check(struct kvd_rmac *m, const void *buf, size_t len,
		   const struct kvd_rval_want *w, enum kvd_rval_fail *fail, const char **why)
{
	const uint8_t *b = buf;
	size_t off = kvd_rval_payload_off(w->bt);

	/* An item of its block's length in its three pieces; any other is
	 * refused by kvd_rval_check_v (after its magic and version). */
	if (len != kvd_rval_bytes(w->bt, w->ns->page_bytes))
		return kvd_rval_check_v(m, buf, len < off ? len : off, NULL, 0, NULL, len, w, fail,
					why);
	return kvd_rval_check_v(m, b, off, b + off, len - off - KVD_RVAL_MAC,
				b + len - KVD_RVAL_MAC, len, w, fail, why);
}

int kvd_rval_check_v(struct kvd_rmac *m, const void *head, size_t head_len, const void *payload,
		     size_t payload_len, const uint8_t *tag, size_t len,
		     const struct kvd_rval_want *w, enum kvd_rval_fail *fail, const char **why)
{
	const uint8_t *b = head;
	struct kvd_rpiece p[2] = { { (void *)head, head_len }, { (void *)payload, payload_len } };
	uint8_t want_tag[KVD_RVAL_MAC];
	struct kvd_rval_hdr h;
	struct kvshm_ns ns;

	*fail = KVD_RVAL_OK;
	*why = NULL;
	if (head_len < sizeof(h))
		return refuse(fail, why, KVD_RVAL_FORMAT, "item shorter than its header");
	memcpy(&h, b, sizeof(h));
	if (h.magic != KVD_RVAL_MAGIC)
		return refuse(fail, why, KVD_RVAL_FORMAT, "not a kvcached block (bad magic)");
	if (h.version != KVD_RVAL_VERSION)
		return refuse(fail, why, KVD_RVAL_VERSION_OTHER,
			      "block written in another item format version (another release)");
	if (h.block_tokens != w->bt || h.payload_bytes != w->ns->page_bytes ||
	    len != kvd_rval_bytes(w->bt, w->ns->page_bytes) || !tag ||
	    head_len != kvd_rval_payload_off(w->bt) || payload_len != w->ns->page_bytes)
		return refuse(fail, why, KVD_RVAL_FORMAT,
			      "item length or geometry does not match the namespace");
	if (mac_pieces(m, p, 2, h.nonce, want_tag) ||
	    crypto_verify_16(want_tag, tag))
		return refuse(fail, why, KVD_RVAL_BADMAC,
			      "MAC does not check (damaged, or sealed under another secret)");
	/* The namespace, checked as a HELLO declaring it would be, then
	 * against the client's own. */
	if (kvproto_ns_declared(&h.ns, &ns) ||
	    memcmp((const char *)&ns + NS_ID_OFF, (const char *)&h.ns + NS_ID_OFF, NS_ID_LEN) ||
	    memcmp((const char *)&ns + NS_ID_OFF, (const char *)w->ns + NS_ID_OFF, NS_ID_LEN))
		return refuse(fail, why, KVD_RVAL_IDENTITY, "block of another namespace");
	if (!kvshm_key_eq(h.key, w->key) || !kvshm_key_eq(h.parent, w->parent))
		return refuse(fail, why, KVD_RVAL_IDENTITY, "block of another key or parent");
	if (memcmp(b + sizeof(h), w->tokens, (size_t)w->bt * sizeof(uint32_t)))
		return refuse(fail, why, KVD_RVAL_TOKENS, "block of other tokens under the same key");
	return 0;
}

static char *hex128(char *p, struct kvshm_key k)
{
	static const char digits[] = "0123456789abcdef";
	int i;

	for (i = 60; i >= 0; i -= 4)
		*p++ = digits[(k.hi >> i) & 15];
	for (i = 60; i >= 0; i -= 4)
		*p++ = digits[(k.lo >> i) & 15];
	return p;
}

size_t kvd_rval_key(char *out, const char *prefix, struct kvshm_key ns_id, struct kvshm_key key)
{
	size_t n = strnlen(prefix, KVD_RVAL_PREFIX_MAX - 1);
	char *p = out;

	memcpy(p, prefix, n);
	p += n;
	*p++ = ':';
	p = hex128(p, ns_id);
	*p++ = ':';
	p = hex128(p, key);
	*p = 0;
	return (size_t)(p - out);
}

bool kvd_rval_prefix_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (!n || n >= KVD_RVAL_PREFIX_MAX)
		return false;
	for (i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* ------------------------------------------------------------ servers */

static int spec_bad(const char **why, const char *w)
{
	*why = w;
	return -EINVAL;
}

static bool host_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '-' || c == '_';
}

/* One entry of len bytes at s. */
static int parse_server(const char *s, size_t len, struct kvd_rserver *sv, const char **why)
{
	const char *host = s, *colon;
	size_t hl, i;
	unsigned long port = 0;

	memset(sv, 0, sizeof(*sv));
	if (!len)
		return spec_bad(why, "empty server entry");
	if (*s == '/') {
		if (len >= 108)
			return spec_bad(why, "Unix socket path longer than 107 bytes");
		for (i = 0; i < len; i++)
			if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
				return spec_bad(why, "control character in a socket path");
		memcpy(sv->host, s, len);
		return 0;
	}
	if (*s == '[') {
		const char *rb = memchr(s, ']', len);

		if (!rb || rb + 1 >= s + len || rb[1] != ':')
			return spec_bad(why, "IPv6 address must read [ADDR]:PORT");
		host = s + 1;
		hl = (size_t)(rb - host);
		colon = rb + 1;
		for (i = 0; i < hl; i++)
			if (!((host[i] >= '0' && host[i] <= '9') || (host[i] >= 'a' && host[i] <= 'f') ||
			      (host[i] >= 'A' && host[i] <= 'F') || host[i] == ':' || host[i] == '.'))
				return spec_bad(why, "not an IPv6 address between the brackets");
	} else {
		colon = NULL;
		for (i = 0; i < len; i++)
			if (s[i] == ':')
				colon = s + i;
		if (!colon)
			return spec_bad(why, "server entry must read HOST:PORT");
		hl = (size_t)(colon - host);
		for (i = 0; i < hl; i++)
			if (!host_char(host[i]))
				return spec_bad(why, "host name has a character other than letters, digits, '.', '-', '_'");
	}
	if (!hl || hl >= sizeof(sv->host))
		return spec_bad(why, "empty or over-long host");
	for (i = (size_t)(colon + 1 - s); i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return spec_bad(why, "port must be a number 1..65535");
		port = port * 10 + (unsigned long)(s[i] - '0');
		if (port > 65535)
			return spec_bad(why, "port must be a number 1..65535");
	}
	if ((size_t)(colon + 1 - s) == len || !port)
		return spec_bad(why, "port must be a number 1..65535");
	memcpy(sv->host, host, hl);
	sv->port = (uint16_t)port;
	return 0;
}

int kvd_remote_parse(const char *spec, struct kvd_rserver *out, unsigned max, unsigned *n,
		     const char **why)
{
	static const char scheme[] = "memcached:";
	const char *p, *end;
	int rc;

	*n = 0;
	if (strncmp(spec, scheme, sizeof(scheme) - 1))
		return spec_bad(why, "must start with memcached: (the one store kvcached speaks)");
	p = spec + sizeof(scheme) - 1;
	if (!*p)
		return spec_bad(why, "no server after memcached:");
	for (;;) {
		end = strchr(p, ',');
		if (!end)
			end = p + strlen(p);
		if (*n == max)
			return spec_bad(why, "more servers than kvcached takes (32)");
		rc = parse_server(p, (size_t)(end - p), &out[*n], why);
		if (rc)
			return rc;
		(*n)++;
		if (!*end)
			return 0;
		p = end + 1;
	}
}
