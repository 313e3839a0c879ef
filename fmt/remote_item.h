/* SPDX-License-Identifier: MIT */
/*
 * remote_item.h - the format of a block in the remote store (tier 2), and
 * the key it is stored under.
 *
 * One memcached item per block:
 *
 *   [header][tokens: block_tokens x uint32][payload: page bytes][MAC: 16]
 *
 * The header names the block completely (magic, version, namespace
 * identity as struct kvshm_ns with `used` zero, key, parent key, payload
 * length) and carries the item's random nonce; the MAC is the Poly1305 tag
 * of everything before it under a one-time key derived by XChaCha20 from
 * the cluster secret's key and that nonce (XChaCha20-Poly1305 with the
 * item as associated data, libsodium). Without a secret
 * (--remote-insecure) the key is a fixed one: the MAC still catches
 * damage, and authenticates nothing.
 *
 * Versions: 1 (HMAC-SHA256, 32-byte MAC, no nonce), 2 (XChaCha20-
 * Poly1305), 3 (this: the namespace identity without the tensor-parallel
 * rank, with the pipeline stage and KV layout, layout 15). The magic
 * and version sit first in every version, so an item of another version is
 * told apart before anything else is read from it, and refused as a miss
 * (KVD_RVAL_VERSION_OTHER, counted in remote_stale).
 *
 * The item's key is "<prefix>:<namespace id>:<block key>" in hex, so that
 * fleets sharing servers under different prefixes never meet, and two
 * namespaces never share an item.
 *
 * Everything here is pure (memory in, memory out) so it can be fuzzed;
 * the daemon checks every fetched item with kvd_rval_check before a byte
 * of it reaches a page.
 */
#ifndef KVD_REMOTE_ITEM_H
#define KVD_REMOTE_ITEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../shm/segment.h"

#define KVD_RVAL_MAGIC   0x31544f4d4552564bull	/* "KVREMOT1" */
#define KVD_RVAL_VERSION 3u
#define KVD_RVAL_MAC     16u	/* Poly1305 tag */
#define KVD_RVAL_NONCE   24u	/* XChaCha20 nonce */
/* Longest item key: prefix, two colons, two 32-digit keys, NUL. */
#define KVD_RVAL_PREFIX_MAX 64u
#define KVD_RVAL_KEY_MAX (KVD_RVAL_PREFIX_MAX + 2 + 64 + 1)

struct kvd_rval_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t block_tokens;
	struct kvshm_key key;
	struct kvshm_key parent;
	uint64_t payload_bytes;		/* the namespace's page bytes */
	uint8_t nonce[KVD_RVAL_NONCE];	/* drawn by kvd_rval_seal */
	struct kvshm_ns ns;		/* namespace identity, `used` 0 */
	/* uint32_t tokens[block_tokens], the payload and the MAC follow */
};

/* What a fetch expects the item to hold. */
struct kvd_rval_want {
	const struct kvshm_ns *ns;	/* the client's namespace row */
	struct kvshm_key key;
	struct kvshm_key parent;
	const uint32_t *tokens;		/* block_tokens of them */
	uint32_t bt;
};

/* Why kvd_rval_check refused an item. */
enum kvd_rval_fail {
	KVD_RVAL_OK = 0,
	KVD_RVAL_FORMAT,	/* length, magic, geometry */
	KVD_RVAL_BADMAC,	/* damaged, or sealed under another secret */
	KVD_RVAL_IDENTITY,	/* another namespace, key or parent */
	KVD_RVAL_TOKENS,	/* same key, other tokens */
	KVD_RVAL_VERSION_OTHER,	/* a kvcached item of another format version */
	KVD_RVAL_NFAIL
};

/* A MAC key (the cluster secret); one per thread: not thread-safe. */
struct kvd_rmac;

/* Set before kvd_rmac_new: Poly1305 from libsodium even where OpenSSL
 * has it (for the tests of that path; the tags are the same). */
extern bool kvd_rmac_sodium_only;

/* 0, or -ENOMEM / -EIO (the crypto library failed). secret may be empty. */
int kvd_rmac_new(struct kvd_rmac **out, const void *secret, size_t len);
void kvd_rmac_free(struct kvd_rmac *m);
/* Whose Poly1305 m runs: "OpenSSL" or "libsodium" (for the log). */
const char *kvd_rmac_impl(const struct kvd_rmac *m);
/* Another MAC with the same key, for another thread. */
int kvd_rmac_dup(struct kvd_rmac **out, const struct kvd_rmac *m);

/* Bytes before the payload (header and tokens), and of a whole item. */
size_t kvd_rval_payload_off(uint32_t bt);
size_t kvd_rval_bytes(uint32_t bt, uint64_t payload_bytes);

/* Write the header and tokens into buf (kvd_rval_payload_off(bt) bytes). */
void kvd_rval_fill(void *buf, const struct kvshm_ns *ns, struct kvshm_key key,
		   struct kvshm_key parent, const uint32_t *tokens, uint32_t bt,
		   uint64_t payload_bytes);

/* A piece of an item, where it lies (the payload: in a pool page). */
struct kvd_rpiece {
	void *base;
	size_t len;
};

/* Seal an item of len bytes (header, tokens and payload written): a fresh
 * random nonce goes into its header, and its last KVD_RVAL_MAC bytes
 * become the MAC of the rest. 0, -EINVAL (shorter than a header and a
 * MAC) or -EIO. */
int kvd_rval_seal(struct kvd_rmac *m, void *buf, size_t len);

/* The same for an item in pieces p[0..n) (p[0] starting with its header):
 * the nonce goes into p[0]'s header and the tag into mac, the pieces
 * being the item's bytes before its tag, in order. The tag is the one
 * kvd_rval_seal gives the same bytes in one buffer. */
int kvd_rval_seal_v(struct kvd_rmac *m, const struct kvd_rpiece *p, int n,
		    uint8_t mac[KVD_RVAL_MAC]);

/* The same under the nonce the header already holds (deterministic: for
 * tests and the fuzzer, which reseal an item to compare its bytes). */
int kvd_rval_mac(struct kvd_rmac *m, void *buf, size_t len);

/*
 * Check an item of len bytes fetched for w: format, then MAC, then
 * identity, then tokens. Returns 0 (the payload at kvd_rval_payload_off
 * is the block), or -EBADMSG with *fail and *why (static text) saying
 * what was wrong.
 */
int kvd_rval_check(struct kvd_rmac *m, const void *buf, size_t len,
		   const struct kvd_rval_want *w, enum kvd_rval_fail *fail, const char **why);

/* The same for an item of len bytes received in pieces: its header and
 * tokens (head_len bytes), its payload (in the page it was read into)
 * and its tag; NULL payload or tag when the item was not of its block's
 * length (refused after its magic and version). Nothing is copied: the
 * payload is checked where it lies. */
int kvd_rval_check_v(struct kvd_rmac *m, const void *head, size_t head_len, const void *payload,
		     size_t payload_len, const uint8_t *tag, size_t len,
		     const struct kvd_rval_want *w, enum kvd_rval_fail *fail, const char **why);

/* The item key of block key in namespace ns_id under prefix, into out
 * (KVD_RVAL_KEY_MAX bytes). Returns its length. */
size_t kvd_rval_key(char *out, const char *prefix, struct kvshm_key ns_id, struct kvshm_key key);

/* Is s a usable prefix: 1..KVD_RVAL_PREFIX_MAX - 1 characters out of
 * letters, digits and "._-" (memcached keys take no spaces or controls)? */
bool kvd_rval_prefix_ok(const char *s);

/* ------------------------------------------------------------ servers */

#define KVD_REMOTE_MAX_SERVERS 32u

/* One memcached server: host and TCP port, or a Unix socket path. */
struct kvd_rserver {
	char host[256];		/* name or IP literal (no brackets); or the path */
	uint16_t port;		/* 0: host is a Unix socket path */
};

/*
 * Parse a --remote value, "memcached:HOST:PORT[,HOST:PORT...]" (HOST a
 * name, an IPv4 literal or a bracketed IPv6 literal; an entry may also be
 * an absolute Unix socket path) into out[] (at most max servers, *n set).
 * Returns 0, or -EINVAL with *why naming the problem.
 */
int kvd_remote_parse(const char *spec, struct kvd_rserver *out, unsigned max, unsigned *n,
		     const char **why);

#endif
